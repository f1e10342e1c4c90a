package jsonvalue

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// jsonSeeds are bodies at the edges of RFC 8259 as encoding/json reads it.
var jsonSeeds = []string{
	`{}`, `[]`, `""`, `0`, `-0.5e+10`, `01`, `1.`, `.5`, `-`, `1e`, `true`, `tru`, `null`, ` {"a" : [1, 2 ,{}]} `,
	`{"model":"m","messages":[{"role":"user","content":"h\u00e9llo \ud83d\ude00 \ud800 x"}]}`,
	"{\"a\":\"\xff\xfe bad utf-8\"}", "{\"a\":\"tab\there\"}", `{"a":"\x"}`, `{"a":1,}`, `[1,]`, `{"a" 1}`,
	`{"mod\u0065l":"x","model":"y"}`, `{"a":"\"\\\/\b\f\n\r\t"}`, `{"a":"\u12"}`, `{} x`, `{"a":[[[[]]]]}`,
	`{"a":{"b":1,"c":[1,{"d":2,"e":[3,4]}],"f":{}},"g":[[],[1,2],{}],"h":3}`, `[{"a":[1,{"b":[]}]},[2,[3]],4]`,
	`{"a":{"b":1,"c":[1,{"d":2}` + "]}}x",
}

// FuzzParseJSON: Parse accepts exactly what encoding/json accepts,
// decodes every string as encoding/json does (text, its length in code
// points), and counts a value's code points as json.Compact writes it.
func FuzzParseJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Parse(data)
		if valid := json.Valid(data); valid != (err == nil) {
			t.Fatalf("Parse error %v, json.Valid %v", err, valid)
		}
		if err != nil {
			return
		}
		var check func(v *Value)
		check = func(v *Value) {
			var buf bytes.Buffer
			if err := json.Compact(&buf, v.Raw); err != nil {
				t.Fatalf("raw %q is not a JSON value: %v", v.Raw, err)
			}
			if n := utf8.RuneCount(buf.Bytes()); n != v.Compact {
				t.Fatalf("compact of %q: %d code points, want %d", v.Raw, v.Compact, n)
			}
			switch v.Kind() {
			case '"':
				var s string
				if err := json.Unmarshal(v.Raw, &s); err != nil {
					t.Fatal(err)
				}
				if v.Text() != s || v.Runes != utf8.RuneCountInString(s) {
					t.Fatalf("string %q: text %q (%d runes), want %q (%d)", v.Raw, v.Text(), v.Runes, s, utf8.RuneCountInString(s))
				}
			case '{':
				var m map[string]json.RawMessage
				if err := json.Unmarshal(v.Raw, &m); err != nil {
					t.Fatal(err)
				}
				for k, raw := range m {
					got := v.Get(k)
					if got == nil || !bytes.Equal(got.Raw, raw) {
						t.Fatalf("member %q: %v, want %q", k, got, raw)
					}
				}
				// Exactly the object's own members, in order, none of a
				// nested object's.
				dec := json.NewDecoder(bytes.NewReader(v.Raw))
				dec.Token() // '{'
				for i := 0; dec.More(); i++ {
					key, _ := dec.Token()
					var raw json.RawMessage
					if err := dec.Decode(&raw); err != nil {
						t.Fatal(err)
					}
					if i >= len(v.Members) || v.Members[i].Key() != key || !bytes.Equal(v.Members[i].Value.Raw, raw) {
						t.Fatalf("member %d of %q (Parse has %d), want %q: %q", i, v.Raw, len(v.Members), key, raw)
					}
					if !dec.More() && i != len(v.Members)-1 {
						t.Fatalf("%q has %d members, Parse %d", v.Raw, i+1, len(v.Members))
					}
				}
				for i := range v.Members {
					check(&v.Members[i].Value)
				}
			case '[':
				var elems []json.RawMessage
				if err := json.Unmarshal(v.Raw, &elems); err != nil {
					t.Fatal(err)
				}
				if len(elems) != len(v.Elems) || v.Elems == nil {
					t.Fatalf("array %q: %d elements (nil %v), want %d", v.Raw, len(v.Elems), v.Elems == nil, len(elems))
				}
				for i := range v.Elems {
					if !bytes.Equal(v.Elems[i].Raw, elems[i]) {
						t.Fatalf("element %d of %q: %q, want %q", i, v.Raw, v.Elems[i].Raw, elems[i])
					}
					check(&v.Elems[i])
				}
			}
		}
		check(v)
	})
}

// TestParseJSONTreeOutlivesItsScratch: the members and elements of one
// parse are its own, not the pooled scratch stack's, so parses after it
// (of other bodies, which reuse the scratch) leave its tree as it was.
func TestParseJSONTreeOutlivesItsScratch(t *testing.T) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"n":[1,2,3]}`)
	v, err := Parse(body)
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		if _, err := Parse([]byte(`{"x":[{"y":{"z":[9,8,7,6]}},{"w":0}],"v":{"u":"t"}}`)); err != nil {
			t.Fatal(err)
		}
	}
	if got := string(v.Get("model").Raw); got != `"m"` {
		t.Errorf("model %s", got)
	}
	msgs := v.Get("messages")
	if len(msgs.Elems) != 2 || msgs.Elems[1].Get("role").Text() != "assistant" || msgs.Elems[0].Get("content").Text() != "a" {
		t.Errorf("messages %s: %+v", msgs.Raw, msgs.Elems)
	}
	if n := v.Get("n"); len(n.Elems) != 3 || string(n.Elems[2].Raw) != "3" {
		t.Errorf("n %+v", n)
	}
	if len(v.Members) != 3 {
		t.Errorf("%d members, want 3", len(v.Members))
	}
}
