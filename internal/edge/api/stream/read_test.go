package stream

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	"iop/internal/sse"
)

// oldFinalHold is FinalHold as it was before its stream had one reader:
// it scanned the relayed bytes for the lines that end a stream
// itself, while the observation and the runs recorder each ran an
// sse.Reader of their own (the observation's over every byte, the runs
// recorder's over the bytes released). It is the reference the one
// reader must agree with.
type oldFinalHold struct {
	sse              bool
	held, scratch    []byte
	final, midLine   bool
	obsReader        sse.Reader // the observation's, over every byte fed
	obsEvents        []string
	runsReader       sse.Reader // the runs recorder's, over the bytes released
	runsEvents       []string
	contentEvents    int
	usageFound       bool
	prompt, complete int
}

func (f *oldFinalHold) split(p []byte) []byte {
	if f.sse {
		f.obsReader.MaxSize, f.obsReader.SkipTooLong = MaxScanBytes, true
		_ = f.obsReader.Feed(p, func(e sse.Event) error {
			f.obsEvents = append(f.obsEvents, string(e.Data))
			ev := ReadEvent(e.Data)
			if ev.Content {
				f.contentEvents++
			}
			if ev.HasUsage {
				f.usageFound, f.prompt, f.complete = true, ev.PromptTokens, ev.CompletionTokens
			}
			return nil
		})
	}
	out := f.oldSplit(p)
	f.runsRead(out)
	return out
}

func (f *oldFinalHold) rest() []byte {
	p := f.held
	f.held = nil
	f.runsRead(p)
	return p
}

func (f *oldFinalHold) runsRead(p []byte) {
	if !f.sse || len(p) == 0 {
		return
	}
	f.runsReader.SkipTooLong = true
	_ = f.runsReader.Feed(p, func(e sse.Event) error {
		f.runsEvents = append(f.runsEvents, string(e.Data))
		return nil
	})
}

func (f *oldFinalHold) oldSplit(p []byte) []byte {
	if f.final {
		f.held = append(f.held, p...)
		return nil
	}
	buf := p
	if len(f.held) > 0 {
		f.scratch = append(append(f.scratch[:0], f.held...), p...)
		buf = f.scratch
	}
	var cut int
	if f.sse {
		cut = f.sseCut(buf)
	} else {
		cut = max(lastNonBlank(buf), 0)
	}
	f.held = append(f.held[:0], buf[cut:]...)
	return buf[:cut]
}

func (f *oldFinalHold) sseCut(buf []byte) int {
	start := 0
	if f.midLine {
		end := oldLineEnd(buf)
		if end < 0 {
			return len(buf)
		}
		f.midLine = false
		start = end + 1
	}
	for start < len(buf) {
		end := oldLineEnd(buf[start:])
		if end < 0 {
			if mayEndStream(buf[start:]) {
				return start
			}
			f.midLine = true
			return len(buf)
		}
		if endsStream(buf[start : start+end]) {
			f.final = true
			return start
		}
		start += end + 1
	}
	return len(buf)
}

func oldLineEnd(p []byte) int {
	n := bytes.IndexByte(p, '\n')
	limit := p
	if n >= 0 {
		limit = p[:n]
	}
	if r := bytes.IndexByte(limit, '\r'); r >= 0 {
		return r
	}
	return n
}

// eventList is a FinalHold's Record that keeps the events' data.
type eventList struct{ data []string }

func (l *eventList) record(ev Event) { l.data = append(l.data, string(ev.Data)) }

// compareWithOld feeds chunks to a FinalHold (with an observation and a
// runs recorder) and to oldFinalHold, and fails unless each chunk lets the
// same bytes through, the same are held, the observation counts the same
// content events and usage, and the runs recorder gets the same events,
// both when the answer ends (rest) and when it fails (no rest). It
// returns the number of bytes the one reader was fed.
func compareWithOld(t *testing.T, sseBody bool, chunks []string) {
	t.Helper()
	obs := &observer{}
	rec := &eventList{}
	f := FinalHold{SSE: sseBody, Observer: obs, Record: rec.record}
	old := oldFinalHold{sse: sseBody}
	for i, c := range chunks {
		got, want := string(f.Split([]byte(c))), string(old.split([]byte(c)))
		if got != want {
			t.Fatalf("chunks %q: chunk %d lets %q through, the old FinalHold %q", chunks, i, got, want)
		}
	}
	if !slices.Equal(rec.data, old.runsEvents) {
		t.Fatalf("chunks %q: a failed run records %q, the old recorder %q", chunks, rec.data, old.runsEvents)
	}
	if got, want := string(f.Rest()), string(old.rest()); got != want {
		t.Fatalf("chunks %q: holds %q, the old FinalHold %q", chunks, got, want)
	}
	if !slices.Equal(rec.data, old.runsEvents) {
		t.Fatalf("chunks %q: an ended run records %q, the old recorder %q", chunks, rec.data, old.runsEvents)
	}
	if !sseBody {
		return
	}
	u := &obs.usage
	if obs.content != old.contentEvents || u.found != old.usageFound || u.prompt != old.prompt || u.completed != old.complete {
		t.Fatalf("chunks %q: observed %d content events, usage %v %d/%d; the old observer %d, %v %d/%d", chunks,
			obs.content, u.found, u.prompt, u.completed, old.contentEvents, old.usageFound, old.prompt, old.complete)
	}
	if got := f.events.Fed(); got != int64(len(strings.Join(chunks, ""))) {
		t.Fatalf("chunks %q: the reader was fed %d bytes, want each byte once", chunks, got)
	}
}

// FuzzTunnelReadOnce: the one reader of a tunnel stream (FinalHold fed
// each chunk once, its events told to the observation and the runs
// recorder) does what the three readers it replaced did, chunk by chunk,
// however the stream is cut: the same bytes pass and are held, the
// observation sees every event, the runs recorder the released ones.
func FuzzTunnelReadOnce(f *testing.F) {
	f.Add(true, []byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"), []byte{3, 17, 1, 40})
	f.Add(true, []byte("data: {\"error\":{}}\r\n\r\ndata: [DONE]\r\n\r\n"), []byte{5})
	f.Add(true, []byte("data: x\rdata:[DONE]\r"), []byte{1, 1, 1, 1, 1, 1, 1, 1, 1, 1})
	f.Add(true, []byte("\xEF\xBB\xBFdata: [DONE]\n\n"), []byte{1, 1, 1})
	f.Add(true, []byte("data: {\"choices\":[{\"delta\":{\"content\":\"h\xC3\xA9\"}}]}\r\n\r\ndata: {\"error\":{\"message\":\"boom\"}}\r\n\r\n"), []byte{6, 40, 1, 1})
	f.Add(true, []byte("data: a\ndata: [DONE]\n\nevent: x\ndata: {\"usage\":{\"prompt_tokens\":1}}\n\n"), []byte{2, 9, 3})
	f.Add(false, []byte("{\"a\":1}\n"), []byte{2})
	f.Fuzz(func(t *testing.T, sseBody bool, data, cuts []byte) {
		var chunks []string
		rest := data
		for _, c := range cuts {
			n := min(int(c), len(rest))
			chunks = append(chunks, string(rest[:n]))
			rest = rest[n:]
		}
		compareWithOld(t, sseBody, append(chunks, string(rest)))
	})
}

// TestTunnelReadOnceOverTheBound: a line over the reader's bound (an event
// of more than MaxScanBytes) is not read, the stream goes on after
// it, and it is held back when it ends the stream, as before.
func TestTunnelReadOnceOverTheBound(t *testing.T) {
	big := strings.Repeat("x", MaxScanBytes+10)
	content := "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
	for _, stream := range []string{
		content + "data: {\"pad\":\"" + big + "\"}\n\n" + content + "data: [DONE]\n\n",
		content + "data: {\"error\":{\"message\":\"" + big + "\"}}\n\n",
	} {
		for _, cut := range []int{len(content) + 3, len(content) + 100, len(stream) - 20} {
			t.Run(fmt.Sprint(len(stream), cut), func(t *testing.T) {
				compareWithOld(t, true, []string{stream[:cut], stream[cut:]})
			})
		}
	}
}
