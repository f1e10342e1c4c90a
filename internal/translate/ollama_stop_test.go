package translate

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestTakeOllamaStopLeavesABodyThatOnlySaysStop: a body whose text says
// "stop" but that has no options.stop comes back as it was (the same
// bytes), not decoded and encoded again.
func TestTakeOllamaStopLeavesABodyThatOnlySaysStop(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"say \"stop\""},{"role":"tool","content":"{\"stop\":1}"}],"stream":true,"options":{"temperature":0}}`)
	out, stop, err := TakeOllamaStop(body)
	if err != nil || stop != nil || !bytes.Equal(out, body) || &out[0] != &body[0] {
		t.Fatalf("TakeOllamaStop = %s, %q, %v; want the body itself", out, stop, err)
	}
}

// FuzzHasOptionsStop: hasOptionsStop is what decoding the body into maps
// says.
func FuzzHasOptionsStop(f *testing.F) {
	for _, s := range []string{`{"options":{"stop":["a"]}}`, `{"options":{"stop":null}}`, `{"options":null}`, `{"options":[]}`,
		`{"options":{"stop":1},"options":{}}`, `{"options":{},"options":{"\u0073top":"x"}}`, `{"Options":{"stop":"x"}}`, `{"x":"\"stop\""}`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		want := false
		var top map[string]json.RawMessage
		if json.Unmarshal(body, &top) == nil {
			var opts map[string]json.RawMessage
			if raw, ok := top["options"]; ok && json.Unmarshal(raw, &opts) == nil {
				_, want = opts["stop"]
			}
		}
		if got := hasOptionsStop(body); got != want {
			t.Fatalf("hasOptionsStop(%q) = %v, decoding says %v", body, got, want)
		}
	})
}
