// Command iop is the iop gateway: an edge serving OpenAI-compatible APIs,
// nodes that run next to model servers, an all-in-one dev mode, and a model
// server simulator. This package holds only flag parsing and wiring.
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"iop/internal/process"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = devVersion

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
	root.AddCommand(newEdgeCommand(&logLevel), newNodeCommand(&logLevel), newDevCommand(&logLevel), newSimCommand(&logLevel), newBenchCommand(&logLevel), newStatusCommand(), newUsageCommand(), newKeysCommand())
	root.AddCommand(newSoakCommand(&logLevel), newCheckCommand(), newConfigCommand(), newVersionCommand())
	return root
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

// hangup returns a channel that gets every SIGHUP of the process, for
// the rest of its life: every iop process reloads (or logs that it has
// nothing to reload) on SIGHUP, and none exits on it.
func hangup() <-chan os.Signal {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	return hup
}

// setUp makes the command's logger at level and loads its config file (if
// any) into cfg, under the flags the user set.
func setUp(cmd *cobra.Command, level, configPath string, cfg any) (*slog.Logger, error) {
	format, err := cmd.Flags().GetString("log-format")
	if err != nil {
		format = "text" // a command used without the root's flags (tests)
	}
	logger, err := process.NewLogger(cmd.ErrOrStderr(), level, format)
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
	return process.LoadConfig(cmd.Flags(), path, v, nil)
}
