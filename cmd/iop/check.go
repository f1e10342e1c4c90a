package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"iop/internal/configschema"
	"iop/internal/process"
	"iop/internal/status"
)

func newCheckCommand() *cobra.Command {
	var kind, edgeURL, apiKey string
	cmd := &cobra.Command{
		Use:   "check [--edge URL] FILE...",
		Short: "Check config files (edge, node or dev) and say what is wrong in config words, with lines",
		Long: "Check config files and print each problem as FILE:LINE:COLUMN: message.\n" +
			"The kind of each file is --kind, else guessed from its name (edge.yaml, node.yaml, dev.yaml), else from its keys.\n" +
			"With --edge, each valid node config is also compared with that edge's aliases (from its admin API):\n" +
			"the models the node would advertise (read from each server that discovers them), which alias targets\n" +
			"they serve, and the targets neither the node nor any node of the edge serves (\"x\" is \"x:latest\").\n" +
			"Exits 1 when a file has a problem, the edge cannot be read, or a comparison warns.",
		Args: func(cmd *cobra.Command, files []string) error {
			if len(files) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "iop check: name the config files to check, e.g. iop check edge.yaml node.yaml")
				return errProblems
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true, // the problems are printed; the exit status says the rest
		RunE: func(cmd *cobra.Command, files []string) error {
			bad := 0
			for _, path := range files {
				data, err := os.ReadFile(path)
				if err != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), err)
					bad++
					continue
				}
				name := kind
				if name == "" {
					name = process.GuessConfigKind(path, data)
				}
				k, err := process.ConfigKind(name)
				if err != nil {
					return err
				}
				if ps := process.CheckConfig(k, data); len(ps) > 0 {
					fmt.Fprintln(cmd.ErrOrStderr(), (&configschema.Problems{File: path, List: ps}).Error())
					bad++
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: ok (%s config)\n", path, k.Name)
				if edgeURL == "" || k.Name != process.KindNode {
					continue
				}
				if apiKey == "" {
					apiKey = os.Getenv("IOP_ADMIN_KEY")
				}
				client := &http.Client{Timeout: 30 * time.Second, Transport: bearerTransport{key: apiKey}}
				lines, warnings, err := process.CheckNodeAgainstEdge(cmd.Context(), client, status.BaseURL(edgeURL), data)
				if err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: %v\n", path, err)
					bad++
					continue
				}
				for _, l := range lines {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", path, l)
				}
				if warnings > 0 {
					bad++
				}
			}
			if bad > 0 {
				return errProblems
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&kind, "kind", "", "edge, node or dev (default: from the file's name, else its keys)")
	cmd.Flags().StringVar(&edgeURL, "edge", "", "compare each node config with this edge's aliases (its HTTP API: URL or host:port)")
	cmd.Flags().StringVar(&apiKey, "api-key", "", "an admin key of the --edge (default $IOP_ADMIN_KEY), needed when the edge has keys")
	cmd.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		fmt.Fprintf(cmd.ErrOrStderr(), "iop check: %v; the files are arguments, e.g. iop check edge.yaml (flags: --kind edge|node|dev, --edge URL, --api-key KEY)\n", err)
		return errProblems
	})
	return cmd
}

// errProblems ends a command whose problems it has already printed.
var errProblems = errors.New("problems found")

func newConfigCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "The config files' reference and JSON Schemas",
	}
	schema := &cobra.Command{
		Use:       "schema edge|node|dev",
		Short:     "Print the JSON Schema of a config file, for editors",
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{process.KindEdge, process.KindNode, process.KindDev},
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := process.ConfigKind(args[0])
			if err != nil {
				return err
			}
			b, err := k.JSONSchema()
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
	var out string
	doc := &cobra.Command{
		Use:   "doc",
		Short: "Print the configuration reference (docs/config.md) in markdown",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := process.ConfigReference()
			if err != nil {
				return err
			}
			if out != "" {
				return os.WriteFile(out, b, 0o644)
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
	doc.Flags().StringVarP(&out, "output", "o", "", "write it to this file instead of stdout")
	cmd.AddCommand(schema, doc)
	return cmd
}
