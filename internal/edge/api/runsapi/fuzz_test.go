package runsapi

import (
	"encoding/json"
	"net/http"
	"testing"

	"iop/internal/edge/api"
	"iop/internal/edge/api/request"
)

// FuzzDecodeRunSubmission: a POST /v1/runs body never panics the decoder;
// a rejection is a 400 naming its field (api.Classify); an accepted one becomes a chat
// completion request that is a JSON object, always streams with usage,
// carries none of the runs API's own fields, and passes the chat checks.
func FuzzDecodeRunSubmission(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi"}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"background":true,"session_id":"s","metadata":{"k":"v"},"stream":false}`,
		`{"model":"m","prompt":"x","messages":[]}`,
		`{"model":"m","prompt":7}`,
		`{"model":"m","prompt":null,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","prompt":"x","metadata":{"":"v"}}`,
		`{"model":"m","prompt":"x","session_id":"a\nb"}`,
		`{"model":"m","prompt":"x","stream_options":{"include_usage":false},"max_tokens":-1}`,
		`[]`, `null`, `{`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		sub, err := decodeRunSubmission(body)
		if err != nil {
			if e := api.Classify(err, nil); e.Status() != http.StatusBadRequest || e.Type != "invalid_request_error" {
				t.Fatalf("%q: error %T %v, want a 400 invalid_request_error", body, err, err)
			}
			return
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(sub.chat.Body, &top); err != nil {
			t.Fatalf("%q: chat body %q is not a JSON object", body, sub.chat.Body)
		}
		for _, k := range []string{"prompt", "background", "session_id", "metadata"} {
			if _, ok := top[k]; ok {
				t.Fatalf("%q: chat body keeps %q", body, k)
			}
		}
		if string(top["stream"]) != "true" || string(top["stream_options"]) != `{"include_usage":true}` {
			t.Fatalf("%q: chat body %s does not stream with usage", body, sub.chat.Body)
		}
		chat, err := request.DecodeChat(sub.chat.Body)
		if err != nil || chat.Request.Model != sub.chat.Model || !chat.Request.Stream || !chat.IncludeUsage {
			t.Fatalf("%q: chat body %s decodes as %+v, %v", body, sub.chat.Body, chat, err)
		}
	})
}
