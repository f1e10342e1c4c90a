package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config is the `tracing:` section of the edge's and the node's config
// file. Every field is optional; a field left empty falls back to its
// standard OpenTelemetry environment variable (named on each field), and
// a field that is set wins over that variable. Tracing is on when an
// endpoint is set (here or in the environment), OTEL_SDK_DISABLED is not
// "true" and OTEL_TRACES_EXPORTER is not "none"; it is off otherwise (the
// default).
type Config struct {
	// Endpoint is the OTLP receiver's URL, as OTEL_EXPORTER_OTLP_ENDPOINT:
	// "http://collector:4317" (grpc; "http" means no TLS) or
	// "https://collector:4318" (http/protobuf: "/v1/traces" is appended
	// when the URL has no path). Environment: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
	// (used as is), else OTEL_EXPORTER_OTLP_ENDPOINT.
	Endpoint string `yaml:"endpoint"`
	// Protocol is "grpc" or "http/protobuf". Environment:
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL;
	// default "grpc".
	Protocol string `yaml:"protocol"`
	// Headers are sent with every export (a collector's API key, say).
	// Environment: OTEL_EXPORTER_OTLP_TRACES_HEADERS / _HEADERS
	// ("k1=v1,k2=v2"); with Headers set, those variables are not read.
	Headers map[string]string `yaml:"headers"`
	// Sampler is one of always_on, always_off, traceidratio,
	// parentbased_always_on, parentbased_always_off,
	// parentbased_traceidratio. Environment: OTEL_TRACES_SAMPLER; default
	// parentbased_always_on.
	Sampler string `yaml:"sampler"`
	// SamplerArg is the ratio of the traceidratio samplers, in [0, 1].
	// Environment: OTEL_TRACES_SAMPLER_ARG; default 1.
	SamplerArg *float64 `yaml:"sampler_arg"`
	// ServiceName is the resource's service.name. Environment:
	// OTEL_SERVICE_NAME; default "iop-edge" or "iop-node".
	ServiceName string `yaml:"service_name"`
}

// ErrInvalidConfig marks a tracing configuration that cannot be used.
var ErrInvalidConfig = errors.New("invalid tracing config")

// Protocols.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// Getenv reads an environment variable; os.Getenv in production.
type Getenv func(string) string

// settings are the effective settings of c under env.
type settings struct {
	enabled           bool
	endpoint          string // "" means the exporter reads the environment itself
	protocol, sampler string
	ratio             float64
	serviceName       string
}

func (c Config) resolve(env Getenv, defaultService string) (settings, error) {
	s := settings{protocol: ProtocolGRPC, sampler: "parentbased_always_on", ratio: 1, serviceName: defaultService}
	if strings.EqualFold(strings.TrimSpace(env("OTEL_SDK_DISABLED")), "true") ||
		strings.TrimSpace(env("OTEL_TRACES_EXPORTER")) == "none" {
		return s, nil
	}
	s.endpoint = c.Endpoint
	s.enabled = c.Endpoint != "" || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	if p := firstOf(c.Protocol, env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), env("OTEL_EXPORTER_OTLP_PROTOCOL")); p != "" {
		s.protocol = p
	}
	if s.protocol != ProtocolGRPC && s.protocol != ProtocolHTTP {
		return s, fmt.Errorf("%w: protocol %q (want grpc or http/protobuf)", ErrInvalidConfig, s.protocol)
	}
	if v := firstOf(c.Sampler, env("OTEL_TRACES_SAMPLER")); v != "" {
		s.sampler = v
	}
	switch {
	case c.SamplerArg != nil:
		s.ratio = *c.SamplerArg
	case env("OTEL_TRACES_SAMPLER_ARG") != "":
		r, err := strconv.ParseFloat(env("OTEL_TRACES_SAMPLER_ARG"), 64)
		if err != nil {
			return s, fmt.Errorf("%w: OTEL_TRACES_SAMPLER_ARG %q is not a number", ErrInvalidConfig, env("OTEL_TRACES_SAMPLER_ARG"))
		}
		s.ratio = r
	}
	if s.ratio < 0 || s.ratio > 1 {
		return s, fmt.Errorf("%w: sampler ratio %v is outside [0, 1]", ErrInvalidConfig, s.ratio)
	}
	if _, err := s.newSampler(); err != nil {
		return s, err
	}
	if v := firstOf(c.ServiceName, env("OTEL_SERVICE_NAME")); v != "" {
		s.serviceName = v
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return s, fmt.Errorf("%w: endpoint %q is not an http:// or https:// URL", ErrInvalidConfig, c.Endpoint)
		}
	}
	return s, nil
}

func firstOf(vs ...string) string {
	for _, v := range vs {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return ""
}

func (s settings) newSampler() (sdktrace.Sampler, error) {
	switch s.sampler {
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(s.ratio), nil
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(s.ratio)), nil
	default:
		return nil, fmt.Errorf("%w: sampler %q", ErrInvalidConfig, s.sampler)
	}
}

// Validate reports a configuration Start would refuse, wrapping
// ErrInvalidConfig, as read with env.
func (c Config) Validate(env Getenv) error {
	_, err := c.resolve(env, "")
	return err
}

// Tracing is a process's tracer, or nothing (tracing off).
type Tracing struct {
	// Tracer makes the process's spans; nil when tracing is off, which
	// callers test to skip all tracing work (no allocation, no context).
	Tracer   trace.Tracer
	provider *sdktrace.TracerProvider
}

// Enabled reports whether t traces.
func (t *Tracing) Enabled() bool { return t != nil && t.Tracer != nil }

// Shutdown exports the spans still buffered and stops t, waiting at most
// until ctx ends. It does nothing when tracing is off.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// ShutdownTimeout bounds the final export of Shutdown as the processes
// call it.
const ShutdownTimeout = 5 * time.Second

// Start sets up tracing by c and env (os.Getenv when nil) for the service
// defaultService names ("iop-edge", "iop-node"; OTEL_SERVICE_NAME or
// c.ServiceName replace it): an OTLP exporter (grpc or http/protobuf)
// behind a batch span processor (OTEL_BSP_* apply), the sampler, and a
// resource with service.name and OTEL_RESOURCE_ATTRIBUTES. The SDK's
// errors (a failed export) are logged at warn on logger (nil: not at all),
// through OpenTelemetry's process-wide error handler. Off (see Config), it
// returns a Tracing whose Tracer is nil. Errors wrap ErrInvalidConfig, or
// are the exporter's.
func Start(ctx context.Context, c Config, env Getenv, defaultService string, logger *slog.Logger) (*Tracing, error) {
	if env == nil {
		env = os.Getenv
	}
	s, err := c.resolve(env, defaultService)
	if err != nil || !s.enabled {
		return &Tracing{}, err
	}
	exp, err := newExporter(ctx, c, s)
	if err != nil {
		return nil, fmt.Errorf("tracing exporter: %w", err)
	}
	sampler, _ := s.newSampler()
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", s.serviceName)))
	if err != nil && res == nil {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	if logger != nil {
		// The SDK's error handler is one per process (iop dev traces its
		// edge and its node in one): the first logger takes it, and its
		// lines name no service, which they could not tell apart.
		errorHandlerOnce.Do(func() {
			otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
				logger.Warn("tracing: the OpenTelemetry SDK failed (is the endpoint's protocol the one set? OTEL_EXPORTER_OTLP_PROTOCOL: grpc or http/protobuf)", "err", err)
			}))
		})
		endpoint := s.endpoint
		if endpoint == "" {
			endpoint = firstOf(env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), env("OTEL_EXPORTER_OTLP_ENDPOINT"))
		}
		logger.Info("tracing on", "service", s.serviceName, "endpoint", endpoint, "protocol", s.protocol, "sampler", s.sampler, "ratio", s.ratio)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithSampler(sampler), sdktrace.WithResource(res))
	return &Tracing{Tracer: tp.Tracer("iop"), provider: tp}, nil
}

// errorHandlerOnce sets OpenTelemetry's process-wide error handler once.
var errorHandlerOnce sync.Once

func newExporter(ctx context.Context, c Config, s settings) (sdktrace.SpanExporter, error) {
	if s.protocol == ProtocolHTTP {
		var opts []otlptracehttp.Option
		if c.Endpoint != "" {
			u, _ := url.Parse(c.Endpoint)
			if u.Path == "" || u.Path == "/" {
				u.Path = "/v1/traces"
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
		}
		if c.Headers != nil {
			opts = append(opts, otlptracehttp.WithHeaders(c.Headers))
		}
		return otlptracehttp.New(ctx, opts...)
	}
	var opts []otlptracegrpc.Option
	if c.Endpoint != "" {
		opts = append(opts, otlptracegrpc.WithEndpointURL(c.Endpoint))
	}
	if c.Headers != nil {
		opts = append(opts, otlptracegrpc.WithHeaders(c.Headers))
	}
	return otlptracegrpc.New(ctx, opts...)
}

// Propagator is the W3C trace context propagator (traceparent,
// tracestate) every hop uses: the edge reads it from a client's request,
// writes it into the Dispatch's trace_context, and the node reads it there
// and writes it on the provider request.
var Propagator propagation.TraceContext
