package admin

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"iop/internal/edge/api"
	"iop/internal/edge/contract"
)

// fakeResidency records the load or unload asked and answers err.
type fakeResidency struct {
	asked string
	err   error
}

func (f *fakeResidency) KeepModel(_ context.Context, node, provider, model string, unload bool) error {
	f.asked = fmt.Sprintf("%s/%s/%s unload=%v", node, provider, model, unload)
	return f.err
}

// TestAdminLoadUnload: POST /admin/v1/providers/{node}/{provider}/load
// and /unload pass the model to the edge and answer its outcome: 200 with
// the status, 404 for an unknown provider or path, 409 for a conflict,
// 400 for a body without a model, 405 for another method.
func TestAdminLoadUnload(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, method, path, body string
		err                      error
		status                   int
		code, asked              string
	}{
		{"load", "POST", "/admin/v1/providers/n1/p1/load", `{"model":"x"}`, nil, 200, "", "n1/p1/x unload=false"},
		{"unload", "POST", "/admin/v1/providers/n1/p1/unload", `{"model":"x"}`, nil, 200, "", "n1/p1/x unload=true"},
		{"unknown provider", "POST", "/admin/v1/providers/n1/nope/load", `{"model":"x"}`,
			fmt.Errorf("%w: node %q has no provider %q", contract.ErrUnknownProvider, "n1", "nope"), 404, "provider_not_found", "n1/nope/x unload=false"},
		{"conflict", "POST", "/admin/v1/providers/n1/p1/load", `{"model":"x"}`,
			fmt.Errorf("%w: not an Ollama", contract.ErrResidencyConflict), 409, "residency_conflict", "n1/p1/x unload=false"},
		{"no model", "POST", "/admin/v1/providers/n1/p1/load", `{}`, nil, 400, "invalid_request", ""},
		{"other verb", "POST", "/admin/v1/providers/n1/p1/reload", `{"model":"x"}`, nil, 404, "unknown_url", ""},
		{"short path", "POST", "/admin/v1/providers/n1/load", `{"model":"x"}`, nil, 404, "unknown_url", ""},
		{"GET", "GET", "/admin/v1/providers/n1/p1/load", ``, nil, 405, "method_not_allowed", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := &fakeResidency{err: tc.err}
			env := newEnv(t, api.Config{}, Config{Residency: res})
			req, err := http.NewRequest(tc.method, env.srv.URL+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := env.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tc.status)
			}
			if tc.code != "" {
				if got := errorCode(t, string(body)); got != tc.code {
					t.Fatalf("code %q, want %q (%s)", got, tc.code, body)
				}
			}
			if res.asked != tc.asked {
				t.Fatalf("asked %q, want %q", res.asked, tc.asked)
			}
		})
	}
}
