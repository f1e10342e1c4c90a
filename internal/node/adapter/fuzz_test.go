package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"iop/internal/translate"
	"iop/internal/wire/nodev1"
)

// checkOllamaBody checks a translated Ollama request: a JSON object for
// model that streams when asked to. Served model names come from the
// node's YAML config, so they are valid UTF-8: others are not checked.
func checkOllamaBody(t *testing.T, in, out []byte, model string, stream bool) {
	t.Helper()
	if !utf8.ValidString(model) {
		return
	}
	var got struct {
		Model  string `json:"model"`
		Stream *bool  `json:"stream"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%q: translated to %q, not a JSON object: %v", in, out, err)
	}
	if got.Model != model || (stream && (got.Stream == nil || !*got.Stream)) {
		t.Fatalf("%q: translated to %s, want model %q streaming %v", in, out, model, stream)
	}
}

// badRequestOnly fails unless err is an *Error of kind ErrBadRequest.
func badRequestOnly(t *testing.T, in []byte, err error) {
	t.Helper()
	if e, ok := errors.AsType[*Error](err); !ok || e.Kind != ErrBadRequest || e.Message == "" {
		t.Fatalf("%q: error %T %v, want a bad request *Error", in, err, err)
	}
}

// FuzzChatToOllama: translating an OpenAI chat body for Ollama never
// panics; a refusal is a bad request; a translation is a streaming
// /api/chat body for the served model.
func FuzzChatToOllama(f *testing.F) {
	for _, s := range []string{
		`{"model":"x","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0.5,"stop":"x","seed":1}`,
		`{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}}]},
		  {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
		  {"role":"tool","tool_call_id":"c1","content":"42"}],"tools":[{"type":"function","function":{"name":"f"}}],
		  "response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object"}}}}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"https://example.com/x.png"}]}]}`,
		`{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"not json"}}]}]}`,
		`{"messages":[{"role":"user","content":"x"}],"n":3}`,
		`{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},"stop":["a","b"],"max_completion_tokens":7}`,
		`{"messages":[]}`, `{"messages":"x"}`, `[]`,
		`{"messages":[{"role":"developer","content":"d"},{"role":"assistant","content":"a","reasoning_content":"r"}],"reasoning_effort":"minimal",
		  "tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}`,
		`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none","reasoning":{"effort":"none"},"iop_ollama":{"think":true}}`,
		`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{"name":"f"}}]}},"parallel_tool_calls":false}`,
	} {
		f.Add([]byte(s), "llama3:8b")
	}
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		out, err := chatToOllama(body, model)
		if err != nil {
			badRequestOnly(t, body, err)
			return
		}
		checkOllamaBody(t, body, out, model, true)
	})
}

// FuzzCompletionToOllama: the same for an OpenAI completions body and
// /api/generate.
func FuzzCompletionToOllama(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"Once","max_tokens":8,"suffix":"end","temperature":0}`,
		`{"prompt":["one"],"n":1,"best_of":1,"echo":false}`,
		`{"prompt":["a","b"]}`, `{"prompt":[1,2,3]}`, `{"prompt":"x","echo":true}`,
		`{"prompt":"x","logprobs":2}`, `{"prompt":"x","best_of":3}`, `{"prompt":null}`,
	} {
		f.Add([]byte(s), "m")
	}
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		out, err := completionToOllama(body, model)
		if err != nil {
			badRequestOnly(t, body, err)
			return
		}
		checkOllamaBody(t, body, out, model, true)
	})
}

// FuzzEmbeddingsToOllama: the same for an OpenAI embeddings body and
// /api/embed, whose input count must match the body's.
func FuzzEmbeddingsToOllama(f *testing.F) {
	for _, s := range []string{
		`{"input":"x"}`, `{"input":["a","b"],"dimensions":8}`, `{"input":[[1,2]]}`, `{"input":[]}`, `{"input":7}`,
	} {
		f.Add([]byte(s), "m")
	}
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		out, inputs, err := embeddingsToOllama(body, model)
		if err != nil {
			badRequestOnly(t, body, err)
			return
		}
		checkOllamaBody(t, body, out, model, false)
		var got struct{ Input []string }
		if json.Unmarshal(out, &got) != nil || len(got.Input) != inputs || inputs < 1 {
			t.Fatalf("%q: translated to %s with %d inputs", body, out, inputs)
		}
	})
}

// streamOutcome is what the stream reader made of one NDJSON answer: its events
// (generated tool call ids blanked: they are random) and its error.
type streamOutcome struct {
	Events []string
	Err    string
}

// pieces is a response body that reads as payload cut into pieces of the
// given sizes (cycled), as a provider's writes would arrive.
type pieces struct {
	rest  []byte
	sizes []int
	i     int
}

func (p *pieces) Read(b []byte) (int, error) {
	if len(p.rest) == 0 {
		return 0, io.EOF
	}
	n := min(len(b), len(p.rest))
	if len(p.sizes) > 0 {
		n = min(n, p.sizes[p.i%len(p.sizes)])
		p.i++
	}
	n = copy(b, p.rest[:n])
	p.rest = p.rest[n:]
	return n, nil
}

// readOllamaStream runs the Ollama adapter's stream reader over payload,
// read in pieces of the given sizes (all at once when sizes is empty), and
// returns what it made of it.
func readOllamaStream(t *testing.T, o *Ollama, payload []byte, sizes []int) streamOutcome {
	t.Helper()
	ctx := context.Background()
	c := &call{p: o.p, parent: ctx, ctx: ctx, cancel: func() {},
		resp: &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(&pieces{rest: payload, sizes: sizes})}}
	var out streamOutcome
	sink := EventSinkFunc(func(events ...*nodev1.RunEvent) error {
		for _, e := range events {
			for _, tc := range e.ToolCalls {
				if strings.HasPrefix(tc.Id, "call_") && len(tc.Id) == len("call_")+24 {
					tc.Id = "call_generated"
				}
			}
			out.Events = append(out.Events, fmt.Sprintf("%v", e))
		}
		return nil
	})
	if err := o.readStream(c, sink, nil, newStopMatcher(nil)); err != nil {
		e, ok := errors.AsType[*Error](err)
		if !ok {
			t.Fatalf("%q: error %T %v, want an *Error", payload, err, err)
		}
		out.Err = fmt.Sprintf("%v %d %s", e.Kind, e.Status, e.Message)
	}
	return out
}

// FuzzOllamaStream: the node's NDJSON stream reader (readStream), fed any
// bytes as an Ollama answer's body, never panics, reports a failure as an
// *Error, ends a successful answer with exactly one usage and one complete
// event, and gives the same events and error however the provider's writes
// cut the stream.
func FuzzOllamaStream(f *testing.F) {
	for _, s := range []string{
		`{"message":{"role":"assistant","content":"Hel"},"done":false}` + "\n" +
			`{"message":{"role":"assistant","content":"lo"},"done":false}` + "\n" +
			`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":2}` + "\n",
		`{"message":{"content":"","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}},{"id":"call_x","function":{"name":"g","arguments":"{}"}}]},"done":false}` + "\r\n" +
			`{"done":true,"done_reason":"length","eval_count":1e12}`,
		`{"message":{"content":"part"},"done":false}` + "\n" + `{"error":"model crashed"}` + "\n",
		`{"message":{"content":"cut"},"done":false}` + "\n",
		"\n\n  \n{\"response\":\"generate shape\",\"done\":true}\n",
		`not json` + "\n",
		`{"done":true}` + "\n" + `{"message":{"content":"after done"}}` + "\n",
	} {
		f.Add([]byte(s), []byte{5, 17, 1})
	}
	o, err := NewOllama(Config{BaseURL: "http://127.0.0.1:1"}) // the stream comes from the fuzzer
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(o.Close)
	f.Fuzz(func(t *testing.T, payload, cuts []byte) {
		whole := readOllamaStream(t, o, payload, nil)
		var sizes []int
		for _, c := range cuts {
			sizes = append(sizes, int(c)+1)
		}
		cut := readOllamaStream(t, o, payload, sizes)
		if !reflect.DeepEqual(whole, cut) {
			t.Fatalf("%q: cut %v changes the outcome:\n whole %+v\n cut   %+v", payload, sizes, whole, cut)
		}
		if whole.Err != "" {
			return
		}
		usage, complete := 0, 0
		for _, e := range whole.Events {
			usage += strings.Count(e, "TYPE_USAGE")
			complete += strings.Count(e, "TYPE_COMPLETE")
		}
		if usage != 1 || complete != 1 || !strings.Contains(whole.Events[len(whole.Events)-1], "TYPE_COMPLETE") {
			t.Fatalf("%q: a successful answer's events %v", payload, whole.Events)
		}
	})
}

// The translations the Ollama normalizer calls (they live in package
// translate), with its mapping of their *translate.FieldError to a bad
// request.
func chatToOllama(body []byte, model string) ([]byte, error) {
	out, err := translate.ToOllamaChat(body, model, nil)
	return out, asBadRequest(err)
}

func completionToOllama(body []byte, model string) ([]byte, error) {
	out, err := translate.ToOllamaGenerate(body, model, nil)
	return out, asBadRequest(err)
}

func embeddingsToOllama(body []byte, model string) ([]byte, int, error) {
	out, inputs, err := translate.ToOllamaEmbed(body, model, nil)
	return out, inputs, asBadRequest(err)
}

func asBadRequest(err error) error {
	if err == nil {
		return nil
	}
	return badRequest("%v", err)
}
