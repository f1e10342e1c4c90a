package translate

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"
)

func TestFromOllamaEmbed(t *testing.T) {
	for _, c := range []struct {
		name, in, want string
		ext            []string
	}{
		{"string", `{"model":"e","input":"hello"}`, `{"model":"e","input":["hello"],"encoding_format":"float"}`, nil},
		{"batch, dimensions", `{"model":"e","input":["a","b"],"dimensions":256}`,
			`{"model":"e","input":["a","b"],"dimensions":256,"encoding_format":"float"}`, nil},
		{"Ollama-only fields keep their JSON types", `{"model":"e","input":["a"],"truncate":false,"keep_alive":"24h","options":{"num_ctx":512}}`,
			`{"model":"e","input":["a"],"encoding_format":"float","iop_ollama":{"truncate":false,"keep_alive":"24h","options":{"num_ctx":512}}}`,
			[]string{"keep_alive", "options", "truncate"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := FromOllamaEmbed([]byte(c.in))
			if err != nil {
				t.Fatal(err)
			}
			if !translatedAs(t, req, c.want) || req.Operation != Embeddings || req.Stream || req.LoadOnly || req.Model != "e" {
				t.Fatalf("got %+v body %s, want %s", req, req.Body, c.want)
			}
			if !slices.Equal(req.Extension, c.ext) {
				t.Fatalf("extension %v, want %v", req.Extension, c.ext)
			}
		})
	}
	req, err := FromOllamaEmbeddings([]byte(`{"model":"e","prompt":"legacy","keep_alive":300}`))
	if want := `{"model":"e","input":["legacy"],"encoding_format":"float","iop_ollama":{"iop_legacy_embeddings":true,"keep_alive":300}}`; err != nil || !translatedAs(t, req, want) {
		t.Fatalf("legacy: %s, %v; want %s", req.Body, err, want)
	}
	// Nothing to embed: Ollama only loads (or unloads) the model.
	for _, in := range []string{`{"model":"e"}`, `{"model":"e","input":""}`, `{"model":"e","input":[]}`, `{"model":"e","input":null,"keep_alive":0}`} {
		req, err := FromOllamaEmbed([]byte(in))
		if err != nil || !req.LoadOnly || req.Body != nil {
			t.Fatalf("%s: %+v, %v; want a load", in, req, err)
		}
	}
	if req, _ := FromOllamaEmbeddings([]byte(`{"model":"e","prompt":"","keep_alive":"0s"}`)); !req.LoadOnly || !req.Unload {
		t.Fatalf("legacy empty prompt: %+v, want an unload", req)
	}
}

func TestFromOllamaEmbedErrors(t *testing.T) {
	for in, field := range map[string]string{
		`[]`:                            "",
		`{"input":"x"}`:                 "model",
		`{"model":"e","input":7}`:       "input",
		`{"model":"e","input":["a",1]}`: "input",
		`{"model":"e","input":"a","dimensions":1.5}`: "dimensions",
		`{"model":"e","input":"a","options":[]}`:     "options",
	} {
		var fe *FieldError
		if _, err := FromOllamaEmbed([]byte(in)); !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: %v, want a *FieldError naming %q", in, err, field)
		}
	}
	var fe *FieldError
	if _, err := FromOllamaEmbeddings([]byte(`{"model":"e","prompt":["a"]}`)); !errors.As(err, &fe) || fe.Field != "prompt" {
		t.Errorf("legacy array prompt: %v", err)
	}
}

func b64(v ...float32) string {
	buf := make([]byte, 0, 4*len(v))
	for _, f := range v {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(f))
	}
	return base64.StdEncoding.EncodeToString(buf)
}

func TestDecodeOpenAIEmbeddings(t *testing.T) {
	// Out of order, one float and one base64 vector.
	body := `{"object":"list","data":[{"object":"embedding","index":1,"embedding":"` + b64(0.5, -2) + `"},` +
		`{"object":"embedding","index":0,"embedding":[0.25,1]}],"usage":{"prompt_tokens":6,"total_tokens":6}}`
	vectors, prompt, err := DecodeOpenAIEmbeddings([]byte(body))
	if err != nil || prompt != 6 || !reflect.DeepEqual(vectors, [][]float32{{0.25, 1}, {0.5, -2}}) {
		t.Fatalf("got %v, %d, %v", vectors, prompt, err)
	}
	for name, body := range map[string]string{
		"not json":        `{`,
		"duplicate index": `{"data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[2]}]}`,
		"index too large": `{"data":[{"index":1,"embedding":[1]}]}`,
		"bad base64":      `{"data":[{"index":0,"embedding":"%%%"}]}`,
		"odd bytes":       `{"data":[{"index":0,"embedding":"AAAAAAA="}]}`,
		"object vector":   `{"data":[{"index":0,"embedding":{}}]}`,
	} {
		if _, _, err := DecodeOpenAIEmbeddings([]byte(body)); !errors.Is(err, ErrMalformedAnswer) {
			t.Errorf("%s: %v, want ErrMalformedAnswer", name, err)
		}
	}
	var pe *ProviderError
	if _, _, err := DecodeOpenAIEmbeddings([]byte(`{"error":{"message":"no such model"}}`)); !errors.As(err, &pe) || pe.Message != "no such model" {
		t.Errorf("error body: %v", err)
	}
}

func TestNewOllamaEmbedResponse(t *testing.T) {
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	r := NewOllamaEmbedResponse("e", nil, 0, Timings{Start: start, Dispatched: start, End: start.Add(time.Millisecond)})
	if r.Embeddings == nil || r.TotalDuration != int64(time.Millisecond) || r.LoadDuration != 1 {
		t.Fatalf("%+v", r)
	}
}
