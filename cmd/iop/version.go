package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// commit and date are set at build time with -ldflags "-X main.commit=...
// -X main.date=..." (make build); version is in main.go.
var commit, date string

// devVersion is version's value in a build without -ldflags.
const devVersion = "0.1.0-dev"

// buildInfo is the version, commit and build date of this binary: the
// values set with -ldflags, else what the Go toolchain recorded (the
// module's version under go install, the VCS revision and commit time
// under go build in a checkout; "-dirty" when the tree had changes), else
// "unknown".
type buildInfo struct {
	Version, Commit, Date, Go string
}

func readBuildInfo() buildInfo {
	b := buildInfo{Version: version, Commit: commit, Date: date, Go: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if b.Version == devVersion && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			b.Version = bi.Main.Version
		}
		var rev, at string
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if b.Commit == "" && rev != "" {
			b.Commit = rev
			if dirty {
				b.Commit += "-dirty"
			}
		}
		if b.Date == "" {
			b.Date = at
		}
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	if b.Date == "" {
		b.Date = "unknown"
	}
	return b
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print iop's version, commit and build date",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b := readBuildInfo()
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "iop %s\ncommit %s\nbuilt %s\n%s\n", b.Version, b.Commit, b.Date, b.Go)
			return err
		},
	}
}
