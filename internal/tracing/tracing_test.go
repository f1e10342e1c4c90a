package tracing

import (
	"context"
	"errors"
	"testing"
)

func envOf(m map[string]string) Getenv { return func(k string) string { return m[k] } }

// Off by default: no endpoint anywhere, or OTEL_SDK_DISABLED=true, and
// Start returns no tracer.
func TestOffByDefault(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg Config
		env map[string]string
	}{
		"nothing":          {},
		"sampler only":     {Config{Sampler: "always_on"}, map[string]string{"OTEL_SERVICE_NAME": "x"}},
		"sdk disabled env": {Config{}, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "true"}},
		"sdk disabled cfg": {Config{Endpoint: "http://127.0.0.1:4317"}, map[string]string{"OTEL_SDK_DISABLED": "TRUE"}},
		"exporter none":    {Config{Endpoint: "http://127.0.0.1:4317"}, map[string]string{"OTEL_TRACES_EXPORTER": "none"}},
	} {
		t.Run(name, func(t *testing.T) {
			tr, err := Start(context.Background(), tc.cfg, envOf(tc.env), "iop-edge", nil)
			if err != nil {
				t.Fatal(err)
			}
			if tr.Enabled() || tr.Tracer != nil {
				t.Fatal("tracing is on")
			}
			if err := tr.Shutdown(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A field of the config file wins over its environment variable; a field
// left empty falls back to it; then the defaults.
func TestConfigWinsOverEnvironment(t *testing.T) {
	half := 0.5
	env := envOf(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		"OTEL_TRACES_SAMPLER": "always_off", "OTEL_TRACES_SAMPLER_ARG": "0.25", "OTEL_SERVICE_NAME": "from-env",
	})
	s, err := Config{Protocol: ProtocolHTTP, Sampler: "traceidratio", SamplerArg: &half}.resolve(env, "iop-node")
	if err != nil {
		t.Fatal(err)
	}
	if !s.enabled || s.protocol != ProtocolHTTP || s.sampler != "traceidratio" || s.ratio != 0.5 || s.serviceName != "from-env" {
		t.Errorf("settings %+v", s)
	}
	s, err = Config{}.resolve(env, "iop-node")
	if err != nil {
		t.Fatal(err)
	}
	if !s.enabled || s.protocol != ProtocolGRPC || s.sampler != "always_off" || s.ratio != 0.25 || s.serviceName != "from-env" {
		t.Errorf("settings from the environment %+v", s)
	}
	s, err = Config{Endpoint: "http://cfg:4318", ServiceName: "mine"}.resolve(envOf(map[string]string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}), "iop-node")
	if err != nil {
		t.Fatal(err)
	}
	if !s.enabled || s.protocol != ProtocolHTTP || s.sampler != "parentbased_always_on" || s.ratio != 1 || s.serviceName != "mine" {
		t.Errorf("settings %+v", s)
	}
}

// Settings Start cannot use are refused with ErrInvalidConfig.
func TestInvalidConfig(t *testing.T) {
	two := 2.0
	for name, tc := range map[string]struct {
		cfg Config
		env map[string]string
	}{
		"protocol":     {Config{Endpoint: "http://x:1", Protocol: "http/json"}, nil},
		"sampler":      {Config{Endpoint: "http://x:1", Sampler: "sometimes"}, nil},
		"ratio":        {Config{Endpoint: "http://x:1", Sampler: "traceidratio", SamplerArg: &two}, nil},
		"ratio env":    {Config{}, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1", "OTEL_TRACES_SAMPLER_ARG": "half"}},
		"endpoint":     {Config{Endpoint: "collector:4317"}, nil},
		"env protocol": {Config{}, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "udp"}},
	} {
		t.Run(name, func(t *testing.T) {
			if err := tc.cfg.Validate(envOf(tc.env)); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("Validate: %v, want ErrInvalidConfig", err)
			}
			if _, err := Start(context.Background(), tc.cfg, envOf(tc.env), "iop-edge", nil); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("Start: %v, want ErrInvalidConfig", err)
			}
		})
	}
}
