package deploy

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"

	"iop/internal/process"
)

// TestDockerfileParses reads the Dockerfile with BuildKit's own parser
// (the one docker build uses) and checks what it promises: two stages, a
// static binary (CGO off), an empty base, a non-root user, iop as the
// entrypoint with the edge as the default command; and no parser warning.
func TestDockerfileParses(t *testing.T) {
	t.Parallel()
	f, err := os.Open("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range res.Warnings {
		t.Errorf("Dockerfile:%v: %s %s", w.Location, w.Short, w.Detail)
	}
	stages, _, err := instructions.Parse(res.AST, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(stages) != 2 {
		t.Fatalf("%d stages, want build and the final image", len(stages))
	}
	build, final := stages[0], stages[1]
	if final.BaseName != "scratch" {
		t.Errorf("final stage FROM %s, want scratch", final.BaseName)
	}
	var user, entry, cmd string
	static := false
	for _, c := range build.Commands {
		if r, ok := c.(*instructions.RunCommand); ok && strings.Contains(strings.Join(r.CmdLine, " "), "CGO_ENABLED=0 go build") {
			static = true
		}
	}
	for _, c := range final.Commands {
		switch c := c.(type) {
		case *instructions.UserCommand:
			user = c.User
		case *instructions.EntrypointCommand:
			entry = strings.Join(c.CmdLine, " ")
		case *instructions.CmdCommand:
			cmd = strings.Join(c.CmdLine, " ")
		case *instructions.RunCommand:
			t.Errorf("final stage runs %v: scratch has no shell", c.CmdLine)
		}
	}
	if !static {
		t.Error("the build stage does not build with CGO_ENABLED=0")
	}
	if uid, _, _ := strings.Cut(user, ":"); uid == "" || uid == "0" || uid == "root" {
		t.Errorf("final stage USER %q, want a non-root user", user)
	}
	if entry != "/usr/local/bin/iop" || cmd != "edge --config /etc/iop/edge.yaml" {
		t.Errorf("ENTRYPOINT %q CMD %q", entry, cmd)
	}
}

// TestComposeFileLoads loads compose.yaml with the Compose Specification's
// own loader (compose-go, which validates it against the spec's schema),
// checks that edge, node and sim run one image and that the edge keeps
// its state in a volume, and runs iop check on the config files it mounts.
func TestComposeFileLoads(t *testing.T) {
	t.Parallel()
	opts, err := cli.NewProjectOptions([]string{"../compose.yaml"}, cli.WithWorkingDirectory(".."), cli.WithName("iop"))
	if err != nil {
		t.Fatal(err)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	names := project.ServiceNames()
	slices.Sort(names)
	if !slices.Equal(names, []string{"edge", "node", "sim"}) {
		t.Fatalf("services %v, want edge, node, sim", names)
	}
	mounted := 0
	for _, name := range names {
		s := project.Services[name]
		if s.Image != "iop:latest" {
			t.Errorf("%s: image %q, want the one image iop:latest", name, s.Image)
		}
		if s.Command[0] != name {
			t.Errorf("%s: command %v, want iop %s ...", name, s.Command, name)
		}
		for _, v := range s.Volumes {
			if v.Type != "bind" {
				continue
			}
			data, err := os.ReadFile(v.Source)
			if err != nil {
				t.Fatalf("%s mounts %s: %v", name, v.Source, err)
			}
			k, err := process.ConfigKind(name)
			if err != nil {
				t.Fatal(err)
			}
			if ps := process.CheckConfig(k, data); len(ps) > 0 {
				t.Errorf("%s: %v", filepath.Base(v.Source), ps)
			}
			mounted++
		}
	}
	if mounted != 2 {
		t.Errorf("%d config files mounted, want the edge's and the node's", mounted)
	}
	if edge := project.Services["edge"]; !slices.ContainsFunc(edge.Volumes, func(v types.ServiceVolumeConfig) bool { return v.Type == "volume" && v.Target == "/var/lib/iop" }) {
		t.Error("the edge keeps no volume at /var/lib/iop")
	}
}
