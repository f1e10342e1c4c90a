package sim

import (
	"encoding/json"
	"errors"
	"testing"
)

// parsers are the decoders of outside input: every request body the
// simulator accepts goes through one of them.
var parsers = map[string]func([]byte) (request, error){
	"ollama chat":       parseOllamaChat,
	"ollama generate":   parseOllamaGenerate,
	"ollama embed":      parseOllamaEmbed,
	"ollama embeddings": parseOllamaEmbeddings,
	"openai chat":       parseOpenAIChat,
	"openai completion": parseOpenAICompletion,
	"openai embeddings": parseOpenAIEmbeddings,
}

// FuzzParseRequest feeds arbitrary bodies to every request parser. A parser
// must not panic, must fail only with errInvalidRequest, and on success
// must return a request the generator can serve.
func FuzzParseRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false,"options":{"num_predict":3}}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":2}`,
		`{"model":"m","prompt":[1,2,3],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","input":[[1,2],[3]],"encoding_format":"base64","dimensions":16}`,
		`{"model":"m","input":null}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"format":{"type":"object","properties":{"a":{"type":"array","items":{"enum":["x"]}}}}}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object","properties":{"n":{"type":["integer","null"]}}}}}}`,
		`{"model":"","messages":null}`,
		`[]`,
		`{`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for name, parse := range parsers {
			req, err := parse(body)
			if err != nil {
				if !errors.Is(err, errInvalidRequest) {
					t.Errorf("%s: error %v does not wrap errInvalidRequest", name, err)
				}
				continue
			}
			if req.model == "" {
				t.Errorf("%s: accepted a request without a model", name)
			}
			if req.maxTokens < noLimit {
				t.Errorf("%s: maxTokens %d", name, req.maxTokens)
			}
			if req.dimensions < 0 || req.dimensions > maxEmbedDims {
				t.Errorf("%s: dimensions %d", name, req.dimensions)
			}
			c := complete(1, 4, req)
			switch {
			case req.format == nil && len(c.tokens) > 4:
				t.Errorf("%s: %d tokens for a 4-token default", name, len(c.tokens))
			case req.format != nil && req.maxTokens != noLimit && len(c.tokens) > req.maxTokens:
				t.Errorf("%s: %d tokens of JSON for a limit of %d", name, len(c.tokens), req.maxTokens)
			case req.format != nil && c.finishReason == finishStop && !json.Valid([]byte(c.text())):
				t.Errorf("%s: structured answer %q is not JSON", name, c.text())
			}
			embedAll(1, req)
		}
	})
}
