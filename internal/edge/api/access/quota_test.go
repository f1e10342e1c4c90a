package access

import "testing"

// FuzzQuotaAsk: for any body, quotaAsk never panics and never asks fewer
// prompt tokens than the body has bytes; for an uncapped object, setCap
// writes a cap that quotaAsk then reads back, on every route's field.
func FuzzQuotaAsk(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hello"}]}`,
		`{"model":"m","max_tokens":800,"max_completion_tokens":300}`,
		`{"model":"m","prompt":"x","options":{"num_predict":-1,"temperature":0}}`,
		`{"model":"m","options":null}`,
		`{"model":"m","max_output_tokens":12.5}`,
		`{"max_tokens":"800"}`,
		`[1,2]`,
		``,
	} {
		f.Add(seed)
	}
	paths := []string{"/v1/chat/completions", "/api/generate", "/v1/responses", "/v1/messages", "/v1/embeddings"}
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range paths {
			ask, capped, err := quotaAsk(path, []byte(body))
			if err != nil {
				continue
			}
			if ask.InputTokens != int64(len(body)) || ask.OutputTokens < 0 {
				t.Fatalf("%s %q: ask %+v", path, body, ask)
			}
			if capped {
				continue
			}
			out, err := setCap(path, []byte(body), 77)
			if err != nil {
				continue // not an object (e.g. null) or options not one
			}
			again, capped, err := quotaAsk(path, out)
			if err != nil || !capped || again.OutputTokens != 77 {
				t.Fatalf("%s %q: after setCap %s: %+v capped %v err %v", path, body, out, again, capped, err)
			}
		}
	})
}
