package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"iop/internal/status"
)

func newUsageCommand() *cobra.Command {
	var (
		edgeURL, apiKey string
		q               status.UsageQuery
		asJSON          bool
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Show the usage ledger's sums: requests, tokens and GPU-seconds by day, key, team or model",
		Long: `Show the usage ledger's sums (GET /admin/v1/usage of the edge): requests,
tokens and GPU-seconds (the seconds requests held a provider slot, times the
provider's cost weight), one row per day, key, team, model, provider or node.

--from and --to take an RFC 3339 time, a date (YYYY-MM-DD, midnight in --tz),
Unix seconds, or a span back from now (7d, 36h); --from is inclusive, --to
exclusive.`,
		Example: `  iop usage --edge http://edge:8080 --from 7d
  iop usage --group-by key --team research --from 2026-06-01 --to 2026-07-01
  iop usage --key alice --group-by model --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			now := time.Now()
			for _, t := range []*string{&q.From, &q.To} {
				*t = sinceNow(*t, now)
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			base := status.BaseURL(edgeURL)
			if apiKey == "" {
				apiKey = os.Getenv("IOP_ADMIN_KEY")
			}
			client := &http.Client{Timeout: 30 * time.Second, Transport: bearerTransport{key: apiKey}}
			u, err := status.FetchUsage(ctx, client, base, q)
			if errors.Is(err, syscall.ECONNREFUSED) {
				return fmt.Errorf("no edge answers at %s: start one, or name yours with --edge URL: %w", base, err)
			}
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(u)
			}
			return status.RenderUsage(cmd.OutOrStdout(), u)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&edgeURL, "edge", "http://127.0.0.1:8080", "the edge's HTTP API (URL or host:port)")
	fl.StringVar(&apiKey, "api-key", "", "an admin key of the edge (default $IOP_ADMIN_KEY), needed when the edge has keys")
	fl.StringVar(&q.Key, "key", "", "only the requests of this key (its name)")
	fl.StringVar(&q.Team, "team", "", "only the requests of this team's keys")
	fl.StringVar(&q.Model, "model", "", "only the requests for this model name (as clients asked for it)")
	fl.StringVar(&q.From, "from", "", "the first instant counted: RFC 3339, YYYY-MM-DD, Unix seconds or a span back (7d)")
	fl.StringVar(&q.To, "to", "", "the instant counting stops (exclusive), in --from's forms")
	fl.StringVar(&q.GroupBy, "group-by", "day", "one row per day, key, team, model, provider or node; \"none\" for one total")
	fl.StringVar(&q.TZ, "tz", "", "the IANA time zone of the days and dates (default UTC)")
	fl.BoolVar(&asJSON, "json", false, "print the API's answer as JSON")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if q.GroupBy == "none" {
			q.GroupBy = ""
		}
		return nil
	}
	return cmd
}

// sinceNow turns a span back from now ("7d", "36h", "90m") into an RFC
// 3339 time; any other value is returned as it is, for the edge to read.
func sinceNow(v string, now time.Time) string {
	var span time.Duration
	if days, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 {
			return v
		}
		span = time.Duration(n) * 24 * time.Hour
	} else if d, err := time.ParseDuration(v); err == nil && d >= 0 && strings.ContainsAny(v, "hms") {
		span = d
	} else {
		return v
	}
	return now.Add(-span).UTC().Format(time.RFC3339)
}
