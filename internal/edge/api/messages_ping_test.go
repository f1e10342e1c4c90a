package api

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"reflect"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"iop/internal/edge/contract"
	"iop/internal/translate"
)

// TestPingRunPingsAQuietRun: while a run sends nothing, Recv pings once
// per interval, on the caller's goroutine; a message ends the wait; after
// the message that ends the run Recv returns io.EOF; stop ends the
// receiving goroutine (synctest: no goroutine is left in the bubble).
func TestPingRunPingsAQuietRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		run := liveRun(normalized, 0)
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
		run.up <- events(started(), delta("x"))
		<-got
		time.Sleep(5 * time.Second) // the interval starts again with each Recv
		synctest.Wait()
		if n := pings.Load(); n != 3 {
			t.Errorf("%d pings, want still 3", n)
		}
		run.up <- events(complete("stop"))
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
		run := liveRun(normalized, 0)
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
		if len(run.cancelReasons()) == 0 {
			t.Error("stop did not cancel the run")
		}
	})
}

// TestMessagesQuietStreamPings: a streamed Messages answer's quiet
// callback starts the stream if nothing was sent (status 200,
// message_start and its ping) and sends a ping each time.
func TestMessagesQuietStreamPings(t *testing.T) {
	rec := httptest.NewRecorder()
	h := &handler{cfg: Config{}.withDefaults(), logger: slog.New(slog.DiscardHandler)}
	r := httptest.NewRequest("POST", messagesPath, nil)
	rr := &runResponse{h: h, w: rec, r: r, run: liveRun(normalized, 0), req: &Request{Model: "m"}}
	m := newMessagesRender(rr, DispatchInfo{RunID: "r1"}, translate.AnthropicRequest{Model: "m", Stream: true})
	defer m.pings.stop()
	for range 2 {
		if err := m.quiet(); err != nil {
			t.Fatal(err)
		}
	}
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, headers %v", rec.Code, rec.Header())
	}
	if names := eventNames(messagesEvents(t, rec.Body.String())); !reflect.DeepEqual(names, []string{"message_start", "ping", "ping", "ping"}) {
		t.Errorf("events %q", names)
	}
}
