package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"iop/internal/auth"
	"iop/internal/quota"
)

func newKeysCommand() *cobra.Command {
	keys := &cobra.Command{
		Use:   "keys",
		Short: "Make API keys for the edge (the edge stores only their hashes)",
	}
	var key auth.Key
	var admin bool
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Print a new random API key (once) and the config line that accepts it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key.Name = args[0]
			if admin && (key.MaxConcurrent != 0 || key.RequestsPerMinute != 0 || len(key.Models) != 0 || key.Team != "" || key.Quota != (quota.Limits{})) {
				return fmt.Errorf("admin keys have no limits, models, team or quota")
			}
			secret, hash := auth.Generate()
			key.Hash = hash
			if err := auth.Validate("key", []auth.Key{key}); err != nil {
				return err
			}
			if err := key.Quota.Validate(); err != nil {
				return err
			}
			section := "keys"
			if admin {
				section = "admin_keys"
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "API key %q (shown only now; the edge keeps only its hash):\n\n  %s\n\n", key.Name, secret)
			fmt.Fprintf(out, "Add this line under %s: in the edge config or its keys_file, then reload the edge (SIGHUP):\n\n  %s\n", section, keyLine(key))
			if key.Team != "" {
				fmt.Fprintf(out, "\nThe team %q must be listed under teams: in the same file.\n", key.Team)
			}
			return nil
		},
	}
	fl := create.Flags()
	fl.BoolVar(&admin, "admin", false, "an admin key (for /admin, /metrics, /ui) instead of a client key")
	fl.IntVar(&key.MaxConcurrent, "max-concurrent", 0, "the key's requests in flight at once (0 = no limit)")
	fl.IntVar(&key.RequestsPerMinute, "requests-per-minute", 0, "the key's requests per minute (0 = no limit)")
	fl.StringSliceVar(&key.Models, "models", nil, "the models the key may use (default: all)")
	fl.StringVar(&key.Team, "team", "", "the key's team (listed under teams:), whose quota bounds the sum of its keys")
	fl.Int64Var(&key.Quota.TokensPerMinute, "tokens-per-minute", 0, "the key's quota of tokens per minute (0 = none)")
	fl.Int64Var(&key.Quota.TokensPerDay, "tokens-per-day", 0, "the key's quota of tokens per day (0 = none)")
	fl.Int64Var(&key.Quota.RequestsPerDay, "requests-per-day", 0, "the key's quota of requests per day (0 = none)")
	fl.Float64Var(&key.Quota.GPUSecondsPerDay, "gpu-seconds-per-day", 0, "the key's quota of GPU-seconds per day (0 = none)")
	keys.AddCommand(create)
	return keys
}

// keyLine renders k as one YAML flow mapping (strings double-quoted, so
// any name is safe).
func keyLine(k auth.Key) string {
	parts := []string{"name: " + strconv.Quote(k.Name), "hash: " + strconv.Quote(k.Hash)}
	if k.MaxConcurrent > 0 {
		parts = append(parts, fmt.Sprintf("max_concurrent: %d", k.MaxConcurrent))
	}
	if k.RequestsPerMinute > 0 {
		parts = append(parts, fmt.Sprintf("requests_per_minute: %d", k.RequestsPerMinute))
	}
	if k.Team != "" {
		parts = append(parts, "team: "+strconv.Quote(k.Team))
	}
	if q := quotaLine(k.Quota); q != "" {
		parts = append(parts, "quota: {"+q+"}")
	}
	if len(k.Models) > 0 {
		quoted := make([]string, len(k.Models))
		for i, m := range k.Models {
			quoted[i] = strconv.Quote(m)
		}
		parts = append(parts, "models: ["+strings.Join(quoted, ", ")+"]")
	}
	return "- {" + strings.Join(parts, ", ") + "}"
}

// quotaLine renders the windows of l that keys create sets, as the
// fields of a YAML flow mapping ("" : none).
func quotaLine(l quota.Limits) string {
	var parts []string
	add := func(name string, v int64) {
		if v > 0 {
			parts = append(parts, fmt.Sprintf("%s: %d", name, v))
		}
	}
	add("tokens_per_minute", l.TokensPerMinute)
	add("tokens_per_day", l.TokensPerDay)
	add("requests_per_day", l.RequestsPerDay)
	if l.GPUSecondsPerDay > 0 {
		parts = append(parts, "gpu_seconds_per_day: "+strconv.FormatFloat(l.GPUSecondsPerDay, 'g', -1, 64))
	}
	return strings.Join(parts, ", ")
}
