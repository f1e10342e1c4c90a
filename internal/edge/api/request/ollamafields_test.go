package request

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"iop/internal/jsonvalue"
	"iop/internal/translate"
)

// FuzzStripMembers: taking the iop_ollama member out of a body from the
// spans of its one parse gives the bytes translate.StripExtension gives.
func FuzzStripMembers(f *testing.F) {
	for _, s := range []string{
		`{"iop_ollama":{"think":true}}`, `{"iop_ollama":1,"model":"m"}`, `{"model":"m", "iop_ollama" : {} }`,
		`{ "iop_ollama":1 , "iop_ollama":2 ,"a":3,"iop_ollama":4}`, `{"a":1,"iop_ollama":null}`, `{"iop_\u006fllama":1,"b":2}`,
		`{"model":"m"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		top, err := jsonvalue.Parse(body)
		if err != nil || top.Kind() != '{' {
			return
		}
		want, _, err := translate.StripExtension(body)
		if err != nil {
			t.Fatalf("StripExtension: %v", err)
		}
		if got := stripMembers(body, top, translate.ExtensionKey); !bytes.Equal(got, want) {
			t.Fatalf("stripMembers(%q) = %q, want %q", body, got, want)
		}
	})
}

// FuzzOllamaNeedsAsCanonical: an Ollama request's checks, needs and
// estimate, taken from what the translation decoded (TranslatedChatNeeds,
// CheckTranslatedEmbed), are those decodeChatRequest and
// decodeEmbeddingsRequest find in the canonical body it generated, which
// the route used to decode again.
func FuzzOllamaNeedsAsCanonical(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"héllo","images":["iVBORw0KGgo="]}]}`,
		`{"model":"m","messages":[{"role":"wizard","content":"x"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","description":"a <b> & c \u2028"}}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"nope"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[]}`,
		`{"model":"m","messages":[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{"a":"<1>"}}}]},{"role":"tool","content":"r"}],"think":"high"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"think":true,"options":{"num_predict":5,"stop":["a"]},"format":"json"}`,
		`{"model":"m","prompt":"why","system":"be brief","images":["iVBORw0KGgo="]}`,
		`{"model":"m","prompt":"p","raw":true}`,
		`{"model":"m","input":["a","","c"]}`, `{"model":"m","input":"one","dimensions":0}`, `{"model":"m","input":["a","b"],"dimensions":8}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		words := func(err error) string {
			var re *FieldError
			if errors.As(err, &re) {
				return re.Field + ": " + re.Message
			}
			if err != nil {
				return "other: " + err.Error()
			}
			return ""
		}
		for _, from := range []func([]byte) (translate.Request, error){translate.FromOllamaChat, translate.FromOllamaGenerate} {
			tr, err := from(body)
			if err != nil || tr.LoadOnly || tr.Operation != translate.Chat {
				continue
			}
			want, werr := decodeChatRequest(tr.Body)
			needs, estimate, gerr := TranslatedChatNeeds(&tr)
			if words(gerr) != words(werr) {
				t.Fatalf("body %s: error %q, the canonical body's %q", body, words(gerr), words(werr))
			}
			if werr == nil && (!slices.Equal(needs, want.Needs) || estimate != want.EstimatedInputTokens) {
				t.Fatalf("body %s: needs %q estimate %d, the canonical body's %q %d", body, needs, estimate, want.Needs, want.EstimatedInputTokens)
			}
		}
		tr, err := translate.FromOllamaEmbed(body)
		if err != nil || tr.LoadOnly {
			return
		}
		want, werr := decodeEmbeddingsRequest(tr.Body)
		gerr := CheckTranslatedEmbed(&tr)
		if words(gerr) != words(werr) {
			t.Fatalf("body %s: error %q, the canonical body's %q", body, words(gerr), words(werr))
		}
		if werr == nil && (len(tr.Inputs) != want.Inputs || (tr.InputChars+3)/4 != want.EstimatedInputTokens) {
			t.Fatalf("body %s: %d inputs, estimate %d; the canonical body's %d %d", body, len(tr.Inputs), (tr.InputChars+3)/4, want.Inputs, want.EstimatedInputTokens)
		}
	})
}
