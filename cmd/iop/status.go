package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"iop/internal/status"
)

// clearScreen moves the cursor home and clears the terminal (ANSI), before
// each frame of --watch.
const clearScreen = "\x1b[H\x1b[2J"

func newStatusCommand() *cobra.Command {
	var (
		edgeURL  string
		watch    bool
		asJSON   bool
		interval time.Duration
		apiKey   string
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show an edge's nodes, providers and queues (from its admin API)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval <= 0 {
				return fmt.Errorf("--interval %s: must be positive", interval)
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			base := status.BaseURL(edgeURL)
			if apiKey == "" {
				apiKey = os.Getenv("IOP_ADMIN_KEY")
			}
			client := &http.Client{Timeout: 10 * time.Second, Transport: bearerTransport{key: apiKey}}
			out := cmd.OutOrStdout()
			show := func() error {
				v, err := status.Fetch(ctx, client, base)
				if err != nil {
					return err
				}
				if asJSON {
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					return enc.Encode(v)
				}
				return status.Render(out, v, time.Now())
			}
			if !watch {
				err := show()
				if errors.Is(err, syscall.ECONNREFUSED) {
					return fmt.Errorf("no edge answers at %s: start one, or name yours with --edge URL: %w", base, err)
				}
				return err
			}
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				if !asJSON {
					fmt.Fprint(out, clearScreen)
				}
				if err := show(); err != nil && ctx.Err() == nil {
					fmt.Fprintf(out, "%s: %v\n", base, err)
				}
				select {
				case <-ctx.Done():
					return nil
				case <-tick.C:
				}
			}
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&edgeURL, "edge", "http://127.0.0.1:8080", "the edge's HTTP API (URL or host:port)")
	fl.BoolVar(&watch, "watch", false, "refresh every --interval until interrupted")
	fl.DurationVar(&interval, "interval", 2*time.Second, "refresh interval of --watch")
	fl.BoolVar(&asJSON, "json", false, "print {nodes, providers, queues} as JSON (with --watch, one document per refresh)")
	fl.StringVar(&apiKey, "api-key", "", "an admin key of the edge (default $IOP_ADMIN_KEY), needed when the edge has keys")
	return cmd
}

// bearerTransport sends key, when set, as "Authorization: Bearer key".
type bearerTransport struct{ key string }

func (t bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.key != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+t.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}
