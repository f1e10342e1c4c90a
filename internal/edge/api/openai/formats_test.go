package openai_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/api/openai"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// TestFormatsAsBefore: each case's answer (status, Content-Type,
// Content-Length, a relayed header, body) and the request it dispatched
// are those in testdata/formats.golden.json, which the routes gave before
// they moved out of package api. IOP_UPDATE_GOLDEN=1 rewrites the file.
func TestFormatsAsBefore(t *testing.T) {
	t.Parallel()
	out := map[string]any{}
	for _, c := range formatCases {
		run := apitest.ScriptedRun(pathOf(c.msgs), c.msgs...)
		gw := &apitest.Gateway{Names: []string{"m"}, DispatchFunc: func(context.Context, contract.Request) (apitest.Run, error) { return run, nil }}
		cfg := api.Config{Now: func() time.Time { return time.Unix(1700000000, 0) }}
		cfg.APIs = []api.API{openai.Routes}
		env := apitest.Start(t, gw, api.New(cfg, gw, slog.New(slog.DiscardHandler)))
		resp := env.Post(t, c.path, "application/json", c.body)
		env.WaitHandlers()
		rec := map[string]any{"status": resp.Status, "ct": resp.Header.Get("Content-Type"), "cl": resp.Header.Get("Content-Length"),
			"xp": resp.Header.Get("X-Provider"), "body": resp.Body}
		if reqs := gw.Requests(); len(reqs) > 0 {
			r := reqs[0]
			rec["req"] = map[string]any{"model": r.Model, "op": r.Operation, "stream": r.Stream, "body": string(r.Body), "needs": r.Needs,
				"est": r.EstimatedInputTokens, "headers": r.Headers, "ollama": string(r.OllamaFields)}
		}
		out[c.name] = rec
	}
	got, err := json.MarshalIndent(out, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	const golden = "testdata/formats.golden.json"
	if os.Getenv("IOP_UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) == string(want) {
		return
	}
	var gotCases, wantCases map[string]json.RawMessage
	if err := json.Unmarshal(got, &gotCases); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(want, &wantCases); err != nil {
		t.Fatal(err)
	}
	for name, w := range wantCases {
		if g := gotCases[name]; string(g) != string(w) {
			t.Errorf("%s:\n got %s\nwant %s", name, g, w)
		}
	}
	t.Errorf("the answers differ from %s (%d cases there, %d here)", golden, len(wantCases), len(gotCases))
}

// formatCases are requests of the OpenAI routes and the runs that answer
// them.
var formatCases = []struct {
	name, path, body string
	msgs             []*nodev1.RunUp
}{
	{"chat json", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		[]*nodev1.RunUp{apitest.Events(apitest.Delta("Hel"), apitest.Delta("lo")), apitest.Events(apitest.Usage(3, 2), apitest.Complete("stop"))}},
	{"chat json tools and reasoning", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		[]*nodev1.RunUp{apitest.Events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Thinking: "hmm"},
			&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, ToolCalls: []*nodev1.ToolCallDelta{{Index: 0, Id: "call_1", Name: "f", Arguments: `{"a":`}}},
			&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, ToolCalls: []*nodev1.ToolCallDelta{{Index: 0, Arguments: `1}`}, {Index: 1, Id: "call_2", Name: "g", Arguments: `{}`}}}),
			apitest.Events(apitest.Complete("tool_calls"))}},
	{"chat stream", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		[]*nodev1.RunUp{apitest.Events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Thinking: "hmm"}, apitest.Delta("Hel")),
			apitest.Events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, ToolCalls: []*nodev1.ToolCallDelta{{Index: 0, Id: "call_1", Name: "f", Arguments: `{}`}}}),
			apitest.Events(apitest.Usage(3, 2), apitest.Complete("stop"))}},
	{"chat stream usage", "/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
		[]*nodev1.RunUp{apitest.Events(apitest.Delta("Hel")), apitest.Events(apitest.Usage(3, 2), apitest.Complete("length"))}},
	{"chat stream fails after start", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		[]*nodev1.RunUp{apitest.Events(apitest.Delta("Hel")), apitest.Events(apitest.ErrorEvent(500, "boom"))}},
	{"chat fails before start", "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		[]*nodev1.RunUp{apitest.Events(apitest.ErrorEvent(429, "busy"))}},
	{"chat tunnel", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		[]*nodev1.RunUp{apitest.TunnelHead(200, map[string]string{"Content-Type": "application/json", "X-Provider": "p"}), apitest.TunnelData(`{"id":"x"}`), apitest.TunnelEnd()}},
	{"chat bad body", "/v1/chat/completions", `{"model":"m","messages":[{"role":"robot","content":"hi"}]}`, nil},
	{"completion json", "/v1/completions", `{"model":"m","prompt":"hi"}`,
		[]*nodev1.RunUp{apitest.Events(apitest.Delta("Hel"), apitest.Delta("lo")), apitest.Events(apitest.Usage(3, 2), apitest.Complete("stop"))}},
	{"completion stream usage", "/v1/completions", `{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`,
		[]*nodev1.RunUp{apitest.Events(apitest.Delta("Hel"), apitest.Delta("")), apitest.Events(apitest.Delta("lo")), apitest.Events(apitest.Usage(3, 2), apitest.Complete("length"))}},
	{"completion stream", "/v1/completions", `{"model":"m","prompt":"hi","stream":true}`,
		[]*nodev1.RunUp{apitest.Events(apitest.Delta("Hel")), apitest.Events(apitest.Usage(3, 2), apitest.Complete("stop"))}},
	{"completion stream fails after start", "/v1/completions", `{"model":"m","prompt":"hi","stream":true}`,
		[]*nodev1.RunUp{apitest.Events(apitest.Delta("Hel")), apitest.Events(apitest.ErrorEvent(502, "gone"))}},
	{"completion bad body", "/v1/completions", `{"model":"m","prompt":"hi","n":0}`, nil},
	{"embeddings float", "/v1/embeddings", `{"model":"m","input":["a","b"]}`,
		[]*nodev1.RunUp{apitest.Events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Embeddings: []*nodev1.Embedding{{Values: []float32{0.5, -1}}}},
			&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Embeddings: []*nodev1.Embedding{{Values: []float32{2, 0.25}}}}),
			apitest.Events(apitest.Usage(4, 0), apitest.Complete("stop"))}},
	{"embeddings base64", "/v1/embeddings", `{"model":"m","input":"a","encoding_format":"base64"}`,
		[]*nodev1.RunUp{apitest.Events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Embeddings: []*nodev1.Embedding{{Values: []float32{0.5, -1}}}}),
			apitest.Events(apitest.Usage(1, 0), apitest.Complete("stop"))}},
	{"embeddings too few vectors", "/v1/embeddings", `{"model":"m","input":["a","b"]}`,
		[]*nodev1.RunUp{apitest.Events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Embeddings: []*nodev1.Embedding{{Values: []float32{1}}}}),
			apitest.Events(apitest.Complete("stop"))}},
	{"embeddings ollama member", "/v1/embeddings", `{"model":"m","input":"a","iop_ollama":{"keep_alive":"1m"}}`,
		[]*nodev1.RunUp{apitest.TunnelHead(200, map[string]string{"Content-Type": "application/json"}), apitest.TunnelData(`{"data":[]}`), apitest.TunnelEnd()}},
}

// pathOf is the execution path of a case's run: tunnel when it begins
// with a tunnel head.
func pathOf(msgs []*nodev1.RunUp) contract.Path {
	if len(msgs) > 0 && msgs[0].GetTunnelHead() != nil {
		return contract.PathTunnel
	}
	return contract.PathNormalized
}
