package adapter

import (
	"bytes"
	"encoding/json"
	"maps"
	"testing"
)

func TestRewriteModel(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"plain", `{"model":"a","x":1}`, `{"model":"m","x":1}`},
		{"kept spacing", "{ \"x\" : [1, 2] ,\n \"model\" : \"a\" }", "{ \"x\" : [1, 2] ,\n \"model\" : \"m\" }"},
		{"non-string model", `{"model":null}`, `{"model":"m"}`},
		{"escaped key", `{"mod\u0065l":"a"}`, `{"mod\u0065l":"m"}`},
		{"duplicate keys", `{"model":"a","model":"b"}`, `{"model":"m","model":"m"}`},
		{"nested only", `{"x":{"model":"a"}}`, `{"model":"m","x":{"model":"a"}}`},
		{"empty object", ` {} `, ` {"model":"m"} `},
		{"number edge", `{"model":1,"n":-0.0e+1}`, `{"model":"m","n":-0.0e+1}`},
		{"one of two duplicates already the model", `{"model":"m","model":"b"}`, `{"model":"m","model":"m"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rewriteModel([]byte(tc.in), "m")
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
	// Nothing to change: the body itself comes back, not a copy.
	for _, in := range []string{`{"model":"m","x":1}`, "{ \"x\":1.0, \"model\" : \"\\u006d\" }", `{"model":"m","model":"m"}`} {
		body := []byte(in)
		got, err := rewriteModel(body, "m")
		if err != nil || len(got) != len(body) || &got[0] != &body[0] {
			t.Errorf("rewriteModel(%s) = %s, %v; want the body itself", in, got, err)
		}
	}
	for _, bad := range []string{``, `null`, `[]`, `"x"`, `{`, `{"model"}`, `{"a":1}x`, `{"a":1,}`} {
		if _, err := rewriteModel([]byte(bad), "m"); err == nil {
			t.Errorf("rewriteModel(%q) succeeded", bad)
		}
	}
}

// FuzzRewriteModel: whatever the body, a rewrite that succeeds yields valid
// JSON whose model is the served model (written as json.Marshal writes it,
// unless the body already had it, in any spelling, and comes back itself)
// and whose other members are the body's, byte for byte.
func FuzzRewriteModel(f *testing.F) {
	f.Add([]byte(`{"model":"a","messages":[{"role":"user","content":"hi"}]}`), "m")
	f.Add([]byte(`{}`), "m")
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		out, err := rewriteModel(body, model)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid output %q from %q", out, body)
		}
		var in, got map[string]json.RawMessage
		if err := json.Unmarshal(body, &in); err != nil {
			t.Fatalf("rewrite accepted %q, which does not decode: %v", body, err)
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(model) // invalid UTF-8 becomes U+FFFD, as on every JSON path
		if !bytes.Equal(got["model"], want) {
			var name string
			if !bytes.Equal(out, body) || json.Unmarshal(got["model"], &name) != nil || name != model {
				t.Fatalf("model %s, want %s (or the body as it was, its model %q)", got["model"], want, model)
			}
		}
		delete(in, "model")
		delete(got, "model")
		if !maps.EqualFunc(in, got, func(a, b json.RawMessage) bool { return bytes.Equal(a, b) }) {
			t.Fatalf("members changed: %q -> %q", body, out)
		}
	})
}
