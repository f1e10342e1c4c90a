package anthropic

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// TestPingRunPingsAQuietRun: while a run sends nothing, Recv pings once
// per interval, on the caller's goroutine; a message ends the wait; after
// the message that ends the run Recv returns io.EOF; stop ends the
// receiving goroutine (synctest: no goroutine is left in the bubble).
func TestPingRunPingsAQuietRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		run := apitest.LiveRun(apitest.Normalized, 0)
		caller := make(chan struct{}) // closed while the caller is in Recv
		var pings atomic.Int32
		var inRecv atomic.Bool
		p := newPingRun(run, 10*time.Second, func() error {
			if !inRecv.Load() {
				t.Error("ping outside Recv")
			}
			pings.Add(1)
			return nil
		})
		got := make(chan contract.Message)
		go func() {
			defer close(caller)
			for {
				inRecv.Store(true)
				msg, err := p.Recv()
				inRecv.Store(false)
				if err != nil {
					if err != io.EOF {
						t.Errorf("Recv: %v", err)
					}
					return
				}
				got <- msg
			}
		}()
		time.Sleep(35 * time.Second)
		synctest.Wait()
		if n := pings.Load(); n != 3 {
			t.Errorf("%d pings in 35 s of quiet, want 3", n)
		}
		run.Up <- apitest.Events(apitest.Started(), apitest.Delta("x"))
		<-got
		time.Sleep(5 * time.Second) // the interval starts again with each Recv
		synctest.Wait()
		if n := pings.Load(); n != 3 {
			t.Errorf("%d pings, want still 3", n)
		}
		run.Up <- apitest.Events(apitest.Complete("stop"))
		if msg := <-got; !msg.Ends {
			t.Errorf("message %+v, want the end", msg)
		}
		<-caller // Recv returned io.EOF after the end
		p.stop()
	})
}

// TestPingRunStopCancelsABlockedRun: stop on a run still going cancels it,
// so its receiving goroutine ends and a blocked Recv returns; a failed
// ping stops the pings.
func TestPingRunStopCancelsABlockedRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		run := apitest.LiveRun(apitest.Normalized, 0)
		var pings atomic.Int32
		p := newPingRun(run, time.Second, func() error { pings.Add(1); return io.ErrClosedPipe })
		done := make(chan error)
		go func() {
			_, err := p.Recv()
			done <- err
		}()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := pings.Load(); n != 1 {
			t.Errorf("%d pings, want 1 (a failed ping stops them)", n)
		}
		p.stop()
		if err := <-done; err == nil {
			t.Error("Recv returned no error after stop")
		}
		if len(run.CancelReasons()) == 0 {
			t.Error("stop did not cancel the run")
		}
	})
}

// TestMessagesQuietStreamPings: a streamed Messages answer whose run
// stays quiet starts the stream after messagesPingInterval (status 200,
// message_start and its ping), then sends a ping each interval.
func TestMessagesQuietStreamPings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const quiet = 3*messagesPingInterval + messagesPingInterval/2
		gw := &apitest.Gateway{Names: []string{"m"}, DispatchFunc: func(ctx context.Context, req contract.Request) (Run, error) {
			run := apitest.LiveRun(apitest.Normalized, 2)
			go func() {
				time.Sleep(quiet)
				run.Up <- apitest.Events(apitest.Started(), apitest.Delta("x"))
				run.Up <- apitest.Events(apitest.Complete("stop"))
				close(run.Up)
			}()
			return run, nil
		}}
		w := newTimedWriter()
		r := httptest.NewRequest("POST", messagesPath, strings.NewReader(messagesBody+`,"stream":true}`))
		r.Header.Set("Content-Type", "application/json")
		newHandler(api.Config{}, gw).ServeHTTP(w, r)
		if w.status != 200 || w.header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("status %d, headers %v", w.status, w.header)
		}
		early, _ := w.before(quiet)
		if names := eventNames(messagesEvents(t, early)); !reflect.DeepEqual(names, []string{"message_start", "ping", "ping", "ping"}) {
			t.Errorf("events %q", names)
		}
	})
}

// timedWriter is a streaming http.ResponseWriter that keeps each write
// with the (bubble's) time it came at, for synctest tests.
type timedWriter struct {
	start  time.Time
	header http.Header

	mu     sync.Mutex // guards the fields below
	status int
	writes []timedWrite
}

type timedWrite struct {
	at time.Duration // since start
	p  string
}

func newTimedWriter() *timedWriter {
	return &timedWriter{start: time.Now(), header: http.Header{}}
}

func (w *timedWriter) Header() http.Header { return w.header }

func (w *timedWriter) WriteHeader(status int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status == 0 {
		w.status = status
	}
}

func (w *timedWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, timedWrite{time.Since(w.start), string(p)})
	return len(p), nil
}

func (w *timedWriter) Flush() {}

// before returns what was written before d, and everything.
func (w *timedWriter) before(d time.Duration) (early, all string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var e, a strings.Builder
	for _, wr := range w.writes {
		if wr.at < d {
			e.WriteString(wr.p)
		}
		a.WriteString(wr.p)
	}
	return e.String(), a.String()
}

// firstWrite is when the first byte was written (-1: never).
func (w *timedWriter) firstWrite() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.writes) == 0 {
		return -1
	}
	return w.writes[0].at
}

// firstMessages are a run's first messages, its first token among them,
// and the rest, for each path.
func firstMessages(path contract.Path) (first, rest []*nodev1.RunUp) {
	if path == apitest.Normalized {
		return []*nodev1.RunUp{apitest.Events(apitest.Started(), apitest.Delta("late"))}, []*nodev1.RunUp{apitest.Events(apitest.Usage(3, 1), apitest.Complete("stop"))}
	}
	return []*nodev1.RunUp{apitest.TunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
			apitest.TunnelData(`data: {"choices":[{"index":0,"delta":{"content":"late"}}]}` + "\n\n")},
		[]*nodev1.RunUp{apitest.TunnelData(`data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n"), apitest.TunnelEnd()}
}

// TestRegression_MessagesPingBeforeTheFirstToken: a streamed Messages
// request whose provider sends its first token 25 s after the request
// (iop dev --sim-ttft 25s) got nothing for 25 s, then message_start and
// ping together, though the README promises a ping every 10 s of quiet:
// Dispatch reads ahead to the provider's first message (retry before the
// first byte) and the provider sends its status line with its first
// token, so the run came to the renderer only then. Now, on both paths,
// whether the wait is in Dispatch or in the run's first Recv, the client
// gets message_start and a ping after 10 s and a ping at 20 s, then the
// answer, which ends with message_stop; the message is named after the
// run the request was dispatched as.
func TestRegression_MessagesPingBeforeTheFirstToken(t *testing.T) {
	const ttft = 25 * time.Second
	for _, path := range []contract.Path{apitest.Normalized, apitest.Tunnel} {
		for _, waitIn := range []string{"dispatch", "run"} {
			t.Run(fmt.Sprintf("%v/%s", path, waitIn), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					first, rest := firstMessages(path)
					var runID string
					gw := &apitest.Gateway{Names: []string{"m"}, DispatchFunc: func(ctx context.Context, req contract.Request) (Run, error) {
						runID = req.RunID
						run := apitest.LiveRun(path, len(first)+len(rest))
						run.RunInfo.RunID = req.RunID // as the edge names it
						send := func() {
							for _, m := range append(first, rest...) {
								run.Up <- m
							}
							close(run.Up)
						}
						if waitIn == "dispatch" {
							// The edge's read-ahead: Dispatch returns with the
							// provider's first message.
							time.Sleep(ttft)
							send()
							return run, nil
						}
						go func() { time.Sleep(ttft); send() }()
						return run, nil
					}}
					h := newHandler(api.Config{}, gw)
					w := newTimedWriter()
					r := httptest.NewRequest("POST", messagesPath, strings.NewReader(messagesBody+`,"stream":true}`))
					r.Header.Set("Content-Type", "application/json")
					h.ServeHTTP(w, r)

					early, all := w.before(ttft)
					if w.status != 200 || w.header.Get("Content-Type") != "text/event-stream" {
						t.Fatalf("status %d, headers %v", w.status, w.header)
					}
					if at := w.firstWrite(); at != messagesPingInterval {
						t.Errorf("first write at %v, want %v (the ping interval)", at, messagesPingInterval)
					}
					evs := messagesEvents(t, early)
					if names := eventNames(evs); !reflect.DeepEqual(names, []string{"message_start", "ping", "ping"}) {
						t.Errorf("events before the first token %q, want message_start, ping, ping", names)
					}
					all_ := messagesEvents(t, all)
					names := eventNames(all_)
					if names[len(names)-1] != "message_stop" || slices.Contains(names, "error") {
						t.Errorf("events %q", names)
					}
					msg := accumulate(t, all_)
					if msg["id"] != "msg_"+runID || runID == "" {
						t.Errorf("message id %v, dispatched as run %q", msg["id"], runID)
					}
					if content, _ := json.Marshal(msg["content"]); string(content) != `[{"text":"late","type":"text"}]` {
						t.Errorf("content %s", content)
					}
					if n, _ := gw.Runs()[0].CloseCalls(); n != 1 {
						t.Errorf("Close called %d times", n)
					}
				})
			})
		}
	}
}

// TestRegression_MessagesDispatchFailsAfterPings: a streamed request
// whose dispatch fails after the stream began (its pings) ends with
// Anthropic's error event (a queue timeout: overloaded_error) and no
// message_stop, recorded with the refusal's outcome, not as completed;
// one that fails before the first ping keeps its status (529).
func TestRegression_MessagesDispatchFailsAfterPings(t *testing.T) {
	for _, wait := range []time.Duration{time.Second, 30 * time.Second} {
		t.Run(wait.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				recs := &records{}
				gw := &apitest.Gateway{Names: []string{"m"}, DispatchFunc: func(ctx context.Context, req contract.Request) (Run, error) {
					time.Sleep(wait)
					return nil, fmt.Errorf("%w: m waited %v", api.ErrQueueTimeout, wait)
				}}
				h := newHandler(api.Config{Observer: recs}, gw)
				w := newTimedWriter()
				r := httptest.NewRequest("POST", messagesPath, strings.NewReader(messagesBody+`,"stream":true}`))
				r.Header.Set("Content-Type", "application/json")
				h.ServeHTTP(w, r)
				_, all := w.before(0)
				rec := recs.Only(t)
				if rec.Outcome != contract.OutcomeRefused || rec.ErrorCode != "queue_timeout" {
					t.Errorf("record %+v", rec)
				}
				if wait < messagesPingInterval {
					if typ, _ := anthropicErrorOf(t, all); w.status != statusOverloaded || typ != "overloaded_error" {
						t.Errorf("%d %s", w.status, all)
					}
					return
				}
				evs := messagesEvents(t, all)
				names := eventNames(evs)
				want := []string{"message_start", "ping", "ping", "ping", "error"}
				if w.status != 200 || !reflect.DeepEqual(names, want) {
					t.Fatalf("status %d, events %q, want %q", w.status, names, want)
				}
				if e, _ := evs[len(evs)-1].data["error"].(map[string]any); e["type"] != "overloaded_error" {
					t.Errorf("error event %v", evs[len(evs)-1].data)
				}
			})
		})
	}
}
