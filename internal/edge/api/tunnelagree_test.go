package api

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
	"iop/internal/ledger"
	"iop/internal/wire/nodev1"
)

// awkwardStream is an OpenAI chat stream with CRLF line ends whose output
// is "héllo" and whose usage is 11/2, before its end (end).
func awkwardStream(end string) string {
	return `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"h"}}]}` + "\r\n\r\n" +
		`data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"éllo"},"finish_reason":"stop"}]}` + "\r\n\r\n" +
		`data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}}` + "\r\n\r\n" +
		end
}

// awkwardCuts cuts stream where a reader is most easily wrong: inside
// "data:", inside the UTF-8 sequence of é, between a CR and its LF, inside
// "usage", inside "[DONE]" and inside {"error".
func awkwardCuts(stream string) []string {
	var cuts []int
	at := func(sub string, into int) {
		if i := strings.Index(stream, sub); i >= 0 {
			cuts = append(cuts, i+into)
		}
	}
	at("\r\n\r\ndata", 6)       // "da|ta:"
	at("é", 1)                  // inside é
	at("\r\n", 1)               // CR | LF
	at(`"usage"`, 3)            // "us|age"
	at("[DONE]", 3)             // [DO|NE]
	at(`{"error"`, 4)           // {"er|ror"
	at("}]}\r\n\r\ndata: {", 5) // an event's blank line cut after its CR
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var chunks []string
	last := 0
	for _, c := range cuts {
		chunks = append(chunks, stream[last:c])
		last = c
	}
	return append(chunks, stream[last:])
}

// tunnelRun is a tunnel-path run sending chunks of an event stream, then
// last.
func tunnelRun(chunks []string, last *nodev1.RunUp) *fakeRun {
	msgs := []*nodev1.RunUp{tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"})}
	for _, c := range chunks {
		msgs = append(msgs, tunnelData(c))
	}
	return scriptedRun(contract.PathTunnel, append(msgs, last)...)
}

// waitRecorded waits until the Observer and the ledger have n records
// each (a run of the runs API records its request after its record is
// final, so after a synchronous submission was answered) and returns
// them; it fails after 30 s, or when there are more.
func waitRecorded(t *testing.T, recs *records, led *recordingLedger, n int) ([]observe.RequestRecord, []ledger.Entry) {
	t.Helper()
	var all []observe.RequestRecord
	var entries []ledger.Entry
	eventually(t, fmt.Sprintf("%d records and ledger entries", n), func() bool {
		all, entries = recs.All(), led.all()
		if len(all) > n || len(entries) > n {
			t.Fatalf("%d records and %d ledger entries, want %d of each: %+v", len(all), len(entries), n, all)
		}
		return len(all) == n && len(entries) == n
	})
	return all, entries
}

// eventually waits until cond holds, checking it every 5 ms (on a
// ticker); it fails the test, naming what, after 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: not reached within 30 s", what)
		}
	}
}

// TestTunnelStreamObserversAgree: the metrics (the Observer's record) and
// the usage ledger read a tunnel stream's usage and its failure from the
// same one reading of its bytes, so they agree whatever
// the framing: CRLF line ends, and the stream cut inside "data:", inside a
// UTF-8 sequence, between a CR and its LF, inside "usage", "[DONE]" and
// {"error" (or byte by byte). The stream completes; or the provider sends
// an error event mid-stream (the node's end event says it); or the tunnel
// fails after that error event, whose held bytes the chat client then
// never gets (it gets the edge's error event). The chat client gets the
// provider's bytes unchanged but for that held end. (Package runsapi
// checks that a run of the runs API agrees with them.)
func TestTunnelStreamObserversAgree(t *testing.T) {
	errorEvent := `data: {"error":{"message":"boom","type":"server_error","code":"provider_failed"}}` + "\r\n\r\n"
	for _, tc := range []struct {
		name    string
		stream  string
		last    *nodev1.RunUp
		outcome contract.Outcome
		relayed bool // the chat client gets the stream whole
	}{
		{"completed", awkwardStream("data: [DONE]\r\n\r\n"), tunnelEnd(), contract.OutcomeCompleted, true},
		{"error event mid-stream", awkwardStream(errorEvent),
			&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{ProviderError: "boom"}}},
			contract.OutcomeUpstreamError, true},
		{"tunnel failing after an error event", awkwardStream(errorEvent), tunnelError(502, "connection reset"),
			contract.OutcomeUpstreamError, false},
	} {
		for how, chunks := range map[string][]string{"awkward": awkwardCuts(tc.stream), "bytewise": strings.Split(tc.stream, "")} {
			t.Run(tc.name+"/"+how, func(t *testing.T) {
				recs, led := &records{}, &recordingLedger{}
				env := newEnv(t, Config{Observer: recs, Ledger: led}, func(context.Context, contract.Request) (Run, error) {
					return tunnelRun(chunks, tc.last), nil
				})
				chat := env.post(t, "/v1/chat/completions", "application/json", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`)
				if chat.status != 200 {
					t.Fatalf("chat: status %d", chat.status)
				}
				if got := chat.body == tc.stream; got != tc.relayed {
					t.Errorf("chat client got the stream whole: %v, want %v\n%q", got, tc.relayed, chat.body)
				}
				if !tc.relayed && !strings.HasPrefix(chat.body, strings.TrimSuffix(tc.stream, errorEvent)) {
					t.Errorf("chat client got %q, want the stream up to its error event", chat.body)
				}
				env.waitHandlers()
				all, entries := waitRecorded(t, recs, led, 1)
				byID := map[string]ledger.Entry{}
				for _, e := range entries {
					byID[e.RequestID] = e
				}
				if len(all) != 1 || len(byID) != 1 {
					t.Fatalf("%d records and %d ledger entries, want 1 of each: %+v", len(all), len(byID), all)
				}
				for _, rec := range all {
					e := byID[rec.RequestID]
					if !rec.TokensKnown || rec.InputTokens != 11 || rec.OutputTokens != 2 {
						t.Errorf("%s: metrics record usage %d/%d (known %v), want 11/2", rec.API, rec.InputTokens, rec.OutputTokens, rec.TokensKnown)
					}
					if e.PromptTokens != 11 || e.CompletionTokens != 2 {
						t.Errorf("%s: ledger usage %d/%d, want 11/2", rec.API, e.PromptTokens, e.CompletionTokens)
					}
					if rec.Outcome != tc.outcome || e.Outcome != tc.outcome.String() || e.ErrorCode != rec.ErrorCode {
						t.Errorf("%s: outcome %q (code %q), ledger %q (code %q), want %q", rec.API, rec.Outcome, rec.ErrorCode, e.Outcome, e.ErrorCode, tc.outcome)
					}
				}
			})
		}
	}
}

// TestTunnelStreamParsedOnce: on the chat route each byte of a tunnel
// stream is fed to one reader once: the bytes parsed are the bytes of the
// stream, whatever its framing. (The runs API records a tunnel stream
// from that one reader's events: Answer.RelayRecorded.)
func TestTunnelStreamParsedOnce(t *testing.T) {
	stream := awkwardStream("data: [DONE]\r\n\r\n")
	for how, chunks := range map[string][]string{"awkward": awkwardCuts(stream), "bytewise": strings.Split(stream, ""), "whole": {stream}} {
		t.Run(how, func(t *testing.T) {
			env := newEnv(t, Config{Observer: &records{}, Ledger: &recordingLedger{}}, func(context.Context, contract.Request) (Run, error) {
				return tunnelRun(chunks, tunnelEnd()), nil
			})
			before := tunnelBytesRead.Load()
			if chat := env.post(t, "/v1/chat/completions", "application/json", `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}`); chat.body != stream {
				t.Fatalf("chat: %d %q", chat.status, chat.body)
			}
			env.waitHandlers()
			if n := tunnelBytesRead.Load() - before; n != int64(len(stream)) {
				t.Errorf("chat route: %d bytes parsed, want the stream's %d, once", n, len(stream))
			}
		})
	}
}
