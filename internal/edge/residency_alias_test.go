package edge

import (
	"errors"
	"io"
	"testing"

	"iop/internal/wire/nodev1"
)

// TestRegression_AliasGoesToTheLoadedTarget: an alias whose targets one
// provider all serves goes to the target the provider holds loaded, not
// the first in alias order, which would swap it out: the catalog gave one
// candidate per provider (the first target it serves), so the scheduler
// never saw the loaded one. With none of them loaded, the first target
// in alias order is taken.
func TestRegression_AliasGoesToTheLoadedTarget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		loaded []string
		want   string
	}{
		{"second target loaded", []string{"b"}, "b"},
		{"first target loaded", []string{"a"}, "a"},
		{"none loaded", nil, "a"},
		{"another model loaded", []string{"c"}, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig()
			cfg.Models = map[string]ModelConfig{"pair": {Targets: []string{"a", "b"}}}
			e := startEdge(t, cfg)
			mg := prov("mg", nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL, 2, "a", "b", "c")
			mg.Type = "managed"
			mg.LoadedSet, mg.Loaded, mg.MaxLoadedModels = true, []*nodev1.LoadedModel{}, 1
			for _, m := range tc.loaded {
				mg.Loaded = append(mg.Loaded, &nodev1.LoadedModel{Name: m, Model: m})
			}
			n := e.connect(t, hello("n1", mg))
			for i := range 3 {
				run, rs, d := e.startRun(t, n, chatReq("pair"))
				if got := d.GetServedModel(); got != tc.want {
					t.Fatalf("request %d for the alias went to %q, want %q (loaded: %v)", i, got, tc.want, tc.loaded)
				}
				sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}})
				if _, err := recvAll(run); !errors.Is(err, io.EOF) {
					t.Fatalf("request %d: %v", i, err)
				}
			}
		})
	}
}
