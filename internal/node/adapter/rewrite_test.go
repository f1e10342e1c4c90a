package adapter

import (
	"bytes"
	"encoding/json"
	"maps"
	"strings"
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

// TestRewriteModelUnchangedBodyNotDecoded: a body whose model already is
// the served name goes to the provider as it came, the same bytes, and is
// not decoded to tell (no allocation, where encoding/json's decoder
// allocates for every member).
func TestRewriteModelUnchangedBodyNotDecoded(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":"say \"model\": hi","model":"other"}],"model":"served",` +
		`"tools":[{"type":"function","function":{"name":"model"}}],"stream":true}`)
	var out []byte
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		if out, err = rewriteModel(body, "served"); err != nil {
			t.Fatal(err)
		}
	})
	if &out[0] != &body[0] || len(out) != len(body) {
		t.Fatalf("rewriteModel returned a copy %s, want the body itself", out)
	}
	// 0 allocations; at most 1 under -race, whose sync.Pool drops at
	// random the scanner json.Valid keeps in one. Decoding this body costs
	// several per member (encoding/json's decoder: a token and a raw copy).
	if allocs > 1 {
		t.Errorf("rewriteModel of an unchanged body allocated %v times per call, want 0 (no decode)", allocs)
	}
	// A body that needs the change still gets it, in one pass.
	got, err := rewriteModel(body, "other-name")
	if err != nil || !bytes.Contains(got, []byte(`"model":"other-name"`)) || !bytes.Contains(got, []byte(`"content":"say \"model\": hi","model":"other"`)) {
		t.Errorf("rewriteModel to another name = %s, %v", got, err)
	}
}

// FuzzModelAlready: whenever modelAlready says a body needs no change,
// decoding it says so too (rewriteModel's full path returns the body
// itself).
func FuzzModelAlready(f *testing.F) {
	for _, s := range []string{`{"model":"m"}`, `{"a":{"model":"x"},"model":"m"}`, `{"model":"m","model":"n"}`,
		`{"mod\u0065l":"x","model":"m"}`, `{"model":"m\u0000"}`, `["model","m"]`, `{"x":"\"model\":","model":"m"}`, `{"model": "m" }`} {
		f.Add([]byte(s), "m")
	}
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		if !modelAlready(body, model) {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("modelAlready true for invalid JSON %q", body)
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(body, &top); err != nil {
			t.Fatalf("modelAlready true for a non-object %q", body)
		}
		var name string
		if json.Unmarshal(top["model"], &name) != nil || name != model {
			t.Fatalf("modelAlready true for %q, model %q: its model decodes to %q", body, model, name)
		}
	})
}

// FuzzScanObject: scan, the single pass rewriteModel and modelAlready rest
// on, accepts a body exactly when json.Valid does and it is an object, and
// the spans it records are the body's top-level "model" values: decoding
// the body finds the same last value (encoding/json keeps the last of
// duplicate keys), and each span's value decodes to model exactly when
// scan says so.
func FuzzScanObject(f *testing.F) {
	for _, s := range []string{
		`{"model":"m"}`, ` { } `, `{"a":[1,-0.5e+10,true,false,null,{"b":[]}],"model":"m"}`,
		`{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":1e}`, `{"a":-}`, `{"a":tru}`, `{"a":nulll}`,
		`{"a":"\u00zz"}`, `{"a":"\x"}`, "{\"a\":\"\x01\"}", "{\"a\":\"\xff\"}", "{\"model\":\"\xff\"}",
		`{"mod\u0065l":"m"}`, `{"model":"\u006d"}`, `{"model":"m","model":"n"}`, `{"model":"m",}`,
		`{"a":1}{}`, `{"a":1} x`, `[{"model":"m"}]`, `{"a":{"model":"x"}}`, `{"a" 1}`, `{"a":1 "b":2}`,
		`{"model":"m\"x"}`, `{"model":"<m>"}`, "{\"model\":\"\u00e9\"}",
		`{"a":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`,
		`{"a":` + strings.Repeat("[", 9998) + strings.Repeat("]", 9998) + `}`,
		`{"a":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}`,
	} {
		f.Add([]byte(s), "m")
	}
	f.Add([]byte("{\"model\":\"\xff\"}"), "\xff")
	f.Add([]byte("{\"model\":\"\ufffd\"}"), "\xff")
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		var s objectScan
		ok := s.scan(body, model)
		trimmed := bytes.TrimLeft(body, " \t\r\n")
		want := json.Valid(body) && len(trimmed) > 0 && trimmed[0] == '{'
		if ok != want {
			t.Fatalf("scan(%q) = %v, json.Valid and an object: %v", body, ok, want)
		}
		if !ok {
			return
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(body, &top); err != nil {
			t.Fatal(err)
		}
		last, has := top["model"]
		if has != (s.n > 0) {
			t.Fatalf("scan found %d model members in %q; decoding: %v", s.n, body, has)
		}
		same := true
		for i := range s.n {
			sp := s.span(i)
			v := body[sp.start:sp.end]
			if i == s.n-1 && !bytes.Equal(v, bytes.TrimSpace(last)) {
				t.Fatalf("last model span %q, decoded %q", v, last)
			}
			var name string
			if json.Unmarshal(v, &name) != nil || name != model {
				same = false
			}
		}
		if s.n > 0 && same != s.same {
			t.Fatalf("scan says same=%v for %q, model %q; decoding says %v", s.same, body, model, same)
		}
	})
}
