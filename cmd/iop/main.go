// Command iop is the iop gateway: an edge serving OpenAI-compatible APIs,
// nodes that run next to model servers, an all-in-one dev mode, and a model
// server simulator. This package holds only flag parsing and wiring.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func main() {
	if err := newRootCommand().Execute(); err != nil {
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	var logLevel string
	root := &cobra.Command{
		Use:           "iop",
		Short:         "iop: a self-hosted LLM inference gateway",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.PersistentFlags().String("log-format", "text", "log format: text (key=value) or json (one object a line)")
	root.AddCommand(newEdgeCommand(&logLevel), newNodeCommand(&logLevel), newDevCommand(&logLevel), newSimCommand(&logLevel), newBenchCommand(&logLevel), newStatusCommand(), newKeysCommand())
	root.AddCommand(newSoakCommand(&logLevel))
	return root
}

// newLogger returns a logger on w at level, in format "text" (slog's
// key=value lines) or "json" (one JSON object a line).
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
}

// signalContext returns a context cancelled on SIGINT or SIGTERM, or when
// parent ends (nil: never). After the first signal the default handling is
// restored, so a second one stops the process at once instead of waiting
// for the drain.
func signalContext(parent context.Context) (context.Context, context.CancelFunc) {
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	return ctx, stop
}

// drainSignals returns a context for a process that drains before it
// stops: at the first SIGINT or SIGTERM it calls drain (with the signal's
// name, e.g. "SIGTERM"), at the second it cancels the context; then the
// default handling is restored, so a third stops the process as the
// system does. The context also ends with parent, or stop.
func drainSignals(parent context.Context, drain func(signal string)) (ctx context.Context, stop context.CancelFunc) {
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop = context.WithCancel(parent)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		defer signal.Stop(sigs)
		for first := true; ; first = false {
			select {
			case s := <-sigs:
				if first {
					drain(signalName(s))
					continue
				}
				stop()
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx, stop
}

// signalName is "SIGTERM" for syscall.SIGTERM and so on.
func signalName(s os.Signal) string {
	if n, ok := s.(syscall.Signal); ok {
		if name := unix.SignalName(n); name != "" {
			return name
		}
	}
	return s.String()
}

// setUp makes the command's logger at level and loads its config file (if
// any) into cfg, under the flags the user set.
func setUp(cmd *cobra.Command, level, configPath string, cfg any) (*slog.Logger, error) {
	format, err := cmd.Flags().GetString("log-format")
	if err != nil {
		format = "text" // a command used without the root's flags (tests)
	}
	logger, err := newLogger(cmd.ErrOrStderr(), level, format)
	if err != nil {
		return nil, err
	}
	if err := loadConfig(cmd, configPath, cfg); err != nil {
		return nil, err
	}
	return logger, nil
}

// loadConfig decodes the YAML file at path (if any) into v, the struct the
// command's flags are bound to, then re-applies the flags the user set, so
// flags override the file and the file overrides defaults.
func loadConfig(cmd *cobra.Command, path string, v any) error {
	return reloadConfig(cmd, path, v, nil)
}

// reloadConfig is loadConfig for a configuration read again: after noting
// the flags the user set and before decoding the file, it calls reset (if
// set), which puts v back to its defaults, so that what the file no longer
// says does not linger.
func reloadConfig(cmd *cobra.Command, path string, v any, reset func()) error {
	if path == "" {
		return nil
	}
	type setFlag struct {
		flag  *pflag.Flag
		value string
		slice []string
	}
	var set []setFlag
	cmd.Flags().Visit(func(fl *pflag.Flag) {
		sf := setFlag{flag: fl, value: fl.Value.String()}
		if sl, ok := fl.Value.(pflag.SliceValue); ok {
			sf.slice = sl.GetSlice()
		}
		set = append(set, sf)
	})
	if reset != nil {
		reset()
	}
	if err := loadYAML(path, v); err != nil {
		return err
	}
	for _, sf := range set {
		var err error
		if sl, ok := sf.flag.Value.(pflag.SliceValue); ok {
			err = sl.Replace(sf.slice)
		} else {
			err = sf.flag.Value.Set(sf.value)
		}
		if err != nil {
			return fmt.Errorf("--%s: %w", sf.flag.Name, err)
		}
	}
	return nil
}

// loadYAML decodes the YAML file at path into v, rejecting unknown fields.
func loadYAML(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
