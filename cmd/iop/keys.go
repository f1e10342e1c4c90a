package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"iop/internal/auth"
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
			if admin && (key.MaxConcurrent != 0 || key.RequestsPerMinute != 0 || len(key.Models) != 0) {
				return fmt.Errorf("admin keys have no limits or models")
			}
			secret, hash := auth.Generate()
			key.Hash = hash
			if err := auth.Validate("key", []auth.Key{key}); err != nil {
				return err
			}
			section := "keys"
			if admin {
				section = "admin_keys"
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "API key %q (shown only now; the edge keeps only its hash):\n\n  %s\n\n", key.Name, secret)
			fmt.Fprintf(out, "Add this line under %s: in the edge config or its keys_file, then reload the edge (SIGHUP):\n\n  %s\n", section, keyLine(key))
			return nil
		},
	}
	fl := create.Flags()
	fl.BoolVar(&admin, "admin", false, "an admin key (for /admin, /metrics, /ui) instead of a client key")
	fl.IntVar(&key.MaxConcurrent, "max-concurrent", 0, "the key's requests in flight at once (0 = no limit)")
	fl.IntVar(&key.RequestsPerMinute, "requests-per-minute", 0, "the key's requests per minute (0 = no limit)")
	fl.StringSliceVar(&key.Models, "models", nil, "the models the key may use (default: all)")
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
	if len(k.Models) > 0 {
		quoted := make([]string, len(k.Models))
		for i, m := range k.Models {
			quoted[i] = strconv.Quote(m)
		}
		parts = append(parts, "models: ["+strings.Join(quoted, ", ")+"]")
	}
	return "- {" + strings.Join(parts, ", ") + "}"
}
