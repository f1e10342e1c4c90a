package node

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"iop/internal/wire/nodev1"
)

// upstream is a provider that records each request body it gets, byte for
// byte, and answers as an OpenAI-compatible server (tunnel) or an Ollama
// one (normalized) does.
func upstream(t *testing.T) (*httptest.Server, chan []byte) {
	got := make(chan []byte, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- b
		if r.URL.Path == "/api/chat" {
			io.WriteString(w, `{"message":{"role":"assistant","content":"Hi"},"done":true,"done_reason":"stop","prompt_eval_count":1,"eval_count":1}`+"\n")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

// TestAgentTunnelRelaysAnUnchangedBodyByteForByte: a body that needs no
// change (its model already is the served model, no other change asked)
// reaches the OpenAI-compatible provider exactly as it came: unusual
// spacing, key order, number spellings and \u escapes (the model's
// included: "served\u002dmodel" is "served-model") survive, which no
// decode and encode would keep. The Dispatch's ollama_fields are not sent.
func TestAgentTunnelRelaysAnUnchangedBodyByteForByte(t *testing.T) {
	for name, body := range map[string]string{
		"escaped model": "{ \"stream\" :true ,\n\t\"model\" : \"served\\u002dmodel\",\"messages\":[{\"content\":\"caf\\u00e9 \\ud83d\\ude00\",\"role\":\"user\"}],\"temperature\":1.50, \"n\":1e0 }",
		"plain model":   `{"zz":[ 1, 2 ],"model":"served-model","x":{"b":1,"a":2},"stream":true}` + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			e, addr := startEdge(t)
			up, got := upstream(t)
			startAgent(t, testConfig(addr, ProviderConfig{ID: "oai", Type: "openai", BaseURL: up.URL + "/v1", Models: []string{"served-model"}}), newTestClock(), nil)
			c := connect(t, e, 1, hour)
			m := inlineDispatchMsg("t1", "oai", tunnel, body)
			m.GetDispatch().OllamaFields = []byte(`{"keep_alive":"24h","options":{"num_ctx":8192}}`)
			c.send(t, m)
			r := recv(t, e.runs, "run stream")
			if b := recv(t, got, "provider request"); string(b) != body {
				t.Errorf("provider got\n%q\nwant the body as it came\n%q", b, body)
			}
			if msgs := r.rest(t); !func() bool { _, _, ok := tunnelAnswer(msgs); return ok }() {
				t.Errorf("messages %v, want a complete tunnel", msgs)
			}
		})
	}
}

// TestAgentOllamaFieldsComeFromTheDispatchOnly: an Ollama provider gets the
// Dispatch's ollama_fields set on its request, with their JSON values
// unchanged; an "iop_ollama" member in the body itself is not trusted as
// fields (the edge takes a client's out of the body: one left there came
// from elsewhere) and reaches no provider.
func TestAgentOllamaFieldsComeFromTheDispatchOnly(t *testing.T) {
	e, addr := startEdge(t)
	up, got := upstream(t)
	startAgent(t, testConfig(addr, ProviderConfig{ID: "ol", Type: "ollama", BaseURL: up.URL, Models: []string{"served-model"}}), newTestClock(), nil)
	c := connect(t, e, 1, hour)
	m := inlineDispatchMsg("r1", "ol", normalized, `{"model":"alias","messages":[{"role":"user","content":"hello"}],"temperature":0.5,
		"iop_ollama":{"keep_alive":"1m","think":true,"options":{"top_k":1}}}`)
	m.GetDispatch().OllamaFields = []byte(`{"keep_alive":"24h","options":{"num_ctx":8192,"temperature":2}}`)
	c.send(t, m)
	r := recv(t, e.runs, "run stream")
	b := recv(t, got, "provider request")
	var sent map[string]json.RawMessage
	if err := json.Unmarshal(b, &sent); err != nil {
		t.Fatal(err)
	}
	var opts map[string]json.RawMessage
	json.Unmarshal(sent["options"], &opts)
	if string(sent["keep_alive"]) != `"24h"` || string(opts["num_ctx"]) != "8192" || string(opts["temperature"]) != "0.5" {
		t.Errorf("provider got %s, want the Dispatch's fields where the translation set none", b)
	}
	for _, k := range []string{"iop_ollama", "think"} {
		if _, ok := sent[k]; ok {
			t.Errorf("provider got %s from the body's iop_ollama: %s", k, b)
		}
	}
	if _, ok := opts["top_k"]; ok {
		t.Errorf("provider got options.top_k from the body's iop_ollama: %s", b)
	}
	if evs := eventsOf(r.rest(t)); len(evs) == 0 || evs[len(evs)-1].Type != nodev1.RunEvent_TYPE_COMPLETE {
		t.Errorf("events %v, want a complete run", evs)
	}
}

// TestAgentRefusesOllamaFieldsThatAreNotAnObject: fields an Ollama provider
// cannot take are the client's error (400, invalid_request, param naming
// the iop_ollama member it sent them in), before the provider is called.
func TestAgentRefusesOllamaFieldsThatAreNotAnObject(t *testing.T) {
	e, addr := startEdge(t)
	up, got := upstream(t)
	startAgent(t, testConfig(addr, ProviderConfig{ID: "ol", Type: "ollama", BaseURL: up.URL, Models: []string{"served-model"}}), newTestClock(), nil)
	c := connect(t, e, 1, hour)
	m := inlineDispatchMsg("r1", "ol", normalized, `{"model":"alias","messages":[{"role":"user","content":"hello"}]}`)
	m.GetDispatch().OllamaFields = []byte(`{"options":"big"}`)
	c.send(t, m)
	r := recv(t, e.runs, "run stream")
	evs := eventsOf(r.rest(t))
	if len(evs) != 1 || evs[0].Type != nodev1.RunEvent_TYPE_ERROR || !evs[0].InvalidRequest || evs[0].Param != "iop_ollama" || evs[0].Status != 400 {
		t.Fatalf("events %v, want one 400 invalid_request error naming iop_ollama", evs)
	}
	select {
	case b := <-got:
		t.Fatalf("provider called with %s", b)
	default:
	}
}
