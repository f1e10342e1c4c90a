package translate

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// checkCanonical checks a translated request: a JSON object naming the
// requested model, always streaming with usage, without an ExtensionKey
// member, whose OllamaFields parse and can be set on an Ollama body.
func checkCanonical(t *testing.T, in []byte, req Request) {
	t.Helper()
	var body struct {
		Model         string          `json:"model"`
		Stream        bool            `json:"stream"`
		StreamOptions map[string]bool `json:"stream_options"`
	}
	if err := json.Unmarshal(req.Body, &body); err != nil {
		t.Fatalf("%q: canonical body %q is not a JSON object: %v", in, req.Body, err)
	}
	if body.Model != req.Model || req.Model == "" || !body.Stream || !body.StreamOptions["include_usage"] {
		t.Fatalf("%q: canonical body %s for model %q", in, req.Body, req.Model)
	}
	if _, had, err := StripExtension(req.Body); err != nil || had {
		t.Fatalf("%q: canonical body %s: %s member %v, %v", in, req.Body, ExtensionKey, had, err)
	}
	fields, err := ParseOllamaFields(req.OllamaFields)
	if err != nil {
		t.Fatalf("%q: OllamaFields %s: %v", in, req.OllamaFields, err)
	}
	merged, err := ToOllamaChat([]byte(`{"messages":[{"role":"user","content":"x"}],"temperature":0}`), "m", fields)
	if err != nil || !json.Valid(merged) {
		t.Fatalf("%q: ToOllamaChat with fields %s = %s, %v", in, req.OllamaFields, merged, err)
	}
}

// fuzzOllamaRequest is the property both Ollama request translations share:
// no panic; a rejection is a *FieldError; an accepted request with
// something to generate has a valid canonical body (checkCanonical).
func fuzzOllamaRequest(t *testing.T, from func([]byte) (Request, error), in []byte) {
	req, err := from(in)
	if err != nil {
		if _, ok := errors.AsType[*FieldError](err); !ok {
			t.Fatalf("%q: error %T %v, want a *FieldError", in, err, err)
		}
		return
	}
	if req.LoadOnly {
		if req.Model == "" {
			t.Fatalf("%q: load request without a model", in)
		}
		return
	}
	checkCanonical(t, in, req)
}

// FuzzFromOllamaChat translates arbitrary /api/chat bodies.
func FuzzFromOllamaChat(f *testing.F) {
	for _, s := range []string{
		`{"model":"llama3","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","stream":false,"format":"json","options":{"num_predict":5,"temperature":0.2,"stop":["x"],"num_ctx":4096},"keep_alive":"5m","think":true,
		  "messages":[{"role":"system","content":"s"},{"role":"user","content":"see","images":["iVBORw0KGgo="]},
		  {"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]},{"role":"tool","tool_name":"f","content":"42"}],
		  "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`,
		`{"model":"m","messages":[],"keep_alive":0}`,
		`{"model":"m","format":{"type":"object"},"messages":[{"role":"user","content":"x","thinking":"t"}]}`,
		`{"model":"m","messages":[{"role":"user","images":["not base64!"]}]}`,
		`{"model":"m","options":{"num_predict":99999999999}}`,
		`[]`, `null`, `{"model":7}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) { fuzzOllamaRequest(t, FromOllamaChat, in) })
}

// FuzzFromOllamaGenerate translates arbitrary /api/generate bodies.
func FuzzFromOllamaGenerate(f *testing.F) {
	for _, s := range []string{
		`{"model":"llama3","prompt":"Why is the sky blue?"}`,
		`{"model":"m","prompt":"def f(","suffix":"return 1","options":{"num_predict":8}}`,
		`{"model":"m","prompt":"raw","raw":true,"system":"dropped","template":"t","format":"json"}`,
		`{"model":"m","prompt":"look","images":["iVBORw0KGgo="],"system":"s"}`,
		`{"model":"m","prompt":"x","context":[1,2,3]}`,
		`{"model":"m","prompt":""}`,
		`{"model":"m","prompt":"x","images":["a"],"raw":true}`,
		`"x"`, `{"prompt":"no model"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) { fuzzOllamaRequest(t, FromOllamaGenerate, in) })
}

// streamResult is everything an OpenAIStream gave for one body.
type streamResult struct {
	Texts     string // the text deltas, joined
	Thinkings string // the reasoning deltas, joined
	Answer    Answer
	Err       string
}

// decodeStream feeds body to a new OpenAIStream in writes of the given
// sizes (cycled; the rest at once when sizes is empty) and ends it.
func decodeStream(body []byte, sizes []int) streamResult {
	var s OpenAIStream
	var res streamResult
	onDelta := func(d Delta) error { res.Texts += d.Text; res.Thinkings += d.Thinking; return nil }
	fail := func(err error) streamResult {
		res.Err = err.Error()
		if pe, ok := errors.AsType[*ProviderError](err); ok {
			res.Err = "provider: " + pe.Message + "/" + pe.Code
		}
		return res
	}
	for i := 0; len(body) > 0; i++ {
		n := len(body)
		if len(sizes) > 0 {
			n = min(n, sizes[i%len(sizes)])
		}
		if err := s.Feed(body[:n], onDelta); err != nil {
			return fail(err)
		}
		body = body[n:]
	}
	a, err := s.End()
	if err != nil {
		return fail(err)
	}
	res.Answer = a
	return res
}

// FuzzOpenAIStream: decoding an OpenAI SSE stream never panics, and how the
// stream is cut into writes never changes what it gives: text, tool calls,
// finish reason, usage or error.
func FuzzOpenAIStream(f *testing.F) {
	for _, s := range []string{
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n" +
			"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}]}}]}\r\n\r\n" +
			"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":\"tool_calls\"}]}\r\n\r\ndata: [DONE]\r\n\r\n",
		"data: {\"choices\":[{\"index\":0,\"text\":\"once\",\"finish_reason\":\"length\"}]}\n\n",
		"data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"code\":\"x\"}}\n\ndata: [DONE]\n\n",
		"data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"other choice\"}}]}\n\n: comment\n\ndata: not json\n\n",
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"cut\"}}]}",
		"data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\",\"reasoning\":\"hm\"}}]}\n\n" +
			"data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":{\"x\":1},\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\n",
	} {
		f.Add([]byte(s), []byte{1, 7, 64})
	}
	f.Fuzz(func(t *testing.T, body, cuts []byte) {
		whole := decodeStream(body, nil)
		byteWise := decodeStream(body, []int{1})
		var sizes []int
		for _, c := range cuts {
			sizes = append(sizes, int(c)+1)
		}
		cut := decodeStream(body, sizes)
		if !reflect.DeepEqual(whole, byteWise) || !reflect.DeepEqual(whole, cut) {
			t.Fatalf("%q: results differ by how it was cut:\n whole %+v\n bytes %+v\n cut   %+v", body, whole, byteWise, cut)
		}
	})
}

// FuzzDecodeOpenAIAnswer: decoding a whole answer or an error body never
// panics; an answer is a choice or an error, never both.
func FuzzDecodeOpenAIAnswer(f *testing.F) {
	for _, s := range []string{
		`{"choices":[{"index":0,"message":{"role":"assistant","content":"hi","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
		`{"choices":[{"index":1,"text":"b"},{"index":0,"text":"a","finish_reason":"stop"}]}`,
		`{"error":{"message":"bad","type":"invalid_request_error","code":404}}`,
		`{"error":"plain"}`, `{"message":"m"}`, `{"choices":[]}`, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		a, err := DecodeOpenAIAnswer(body)
		_ = DecodeOpenAIError(body)
		if err != nil && !reflect.DeepEqual(a, Answer{}) {
			t.Fatalf("%q: error %v with answer %+v", body, err, a)
		}
		if err != nil && !errors.Is(err, ErrMalformedAnswer) {
			if _, ok := errors.AsType[*ProviderError](err); !ok {
				t.Fatalf("%q: error %T %v", body, err, err)
			}
		}
	})
}

// FuzzOllamaFields: setting fields on a translated Ollama body never
// panics, gives valid JSON, and never changes a field the translation set
// (options and messages members included).
func FuzzOllamaFields(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"x"}],"temperature":0.1}`), []byte(`{"keep_alive":"5m","model":"no","options":{"num_ctx":8192,"temperature":9}}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":"x"}]}`), []byte(`null`))
	f.Add([]byte(`{"messages":[{"role":"user","content":"x"}]}`), []byte(`{"options":{"a":1},"messages":[{"thinking":"t","role":"no"}]}`))
	f.Add([]byte(`{"messages":[{"role":"assistant","content":"","reasoning":"r"}]}`), []byte(`{"think":true,"messages":[{"thinking":"t"}],"\u0000":1}`))
	f.Fuzz(func(t *testing.T, canonical, raw []byte) {
		fields, err := ParseOllamaFields(raw)
		if err != nil {
			return
		}
		plain, err := ToOllamaChat(canonical, "m", nil)
		if err != nil {
			return
		}
		out, err := ToOllamaChat(canonical, "m", fields)
		if err != nil {
			t.Fatalf("ToOllamaChat(%q) with fields %q: %v", canonical, raw, err)
		}
		var before, after map[string]json.RawMessage
		if json.Unmarshal(out, &after) != nil || json.Unmarshal(plain, &before) != nil {
			t.Fatalf("ToOllamaChat(%q) with fields %q = %q: not a JSON object", canonical, raw, out)
		}
		for k, v := range before {
			switch k {
			case "options", "messages":
				var b, a any
				json.Unmarshal(v, &b)
				json.Unmarshal(after[k], &a)
				if !contains(a, b) {
					t.Fatalf("%s changed from %s to %s", k, v, after[k])
				}
			default:
				if !sameJSON(after[k], v) {
					t.Fatalf("field %s changed from %s to %s", k, v, after[k])
				}
			}
		}
	})
}

// contains reports whether a holds b: equal values, except that an object
// of a may have members b lacks, and arrays compare element by element.
func contains(a, b any) bool {
	switch b := b.(type) {
	case map[string]any:
		a, ok := a.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range b {
			if !contains(a[k], v) {
				return false
			}
		}
		return true
	case []any:
		a, ok := a.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range b {
			if !contains(a[i], b[i]) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

// sameJSON reports whether two JSON values are equal as values.
func sameJSON(a, b []byte) bool {
	var va, vb any
	return json.Unmarshal(a, &va) == nil && json.Unmarshal(b, &vb) == nil && reflect.DeepEqual(va, vb)
}
