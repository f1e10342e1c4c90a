package api

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"

	"iop/internal/ledger"
	"iop/internal/sse"
	"iop/internal/wire/nodev1"
)

// meteredRun is a dispatched Run whose Close records it in the usage
// ledger: the run's usage, read from the messages Recv returns (usage
// events on the normalized path; on the tunnel path the "usage" object of
// the provider's OpenAI answer or stream), its duration and its outcome
// (the Close reason). It only watches: every message passes unchanged.
type meteredRun struct {
	Run
	h     *handler
	once  sync.Once
	mu    sync.Mutex // guards the fields below: Close may run on the client-gone goroutine
	entry ledger.Entry
	tun   usageWatch
}

func (m *meteredRun) Recv() (*nodev1.RunUp, error) {
	msg, err := m.Run.Recv()
	if msg != nil {
		m.mu.Lock()
		m.observe(msg)
		m.mu.Unlock()
	}
	return msg, err
}

// observe reads usage from one message.
func (m *meteredRun) observe(msg *nodev1.RunUp) {
	switch x := msg.GetMsg().(type) {
	case *nodev1.RunUp_Events:
		for _, ev := range x.Events.GetEvents() {
			if ev.GetType() == nodev1.RunEvent_TYPE_USAGE {
				m.entry.PromptTokens, m.entry.CompletionTokens = int64(ev.GetPromptTokens()), int64(ev.GetCompletionTokens())
			}
		}
	case *nodev1.RunUp_TunnelHead:
		for name, v := range x.TunnelHead.GetHeaders() {
			if strings.EqualFold(name, "Content-Type") {
				m.tun.sse = isEventStream(v)
			}
		}
	case *nodev1.RunUp_TunnelData:
		m.tun.write(x.TunnelData.GetData())
	}
}

// Close closes the run, then records it once.
func (m *meteredRun) Close(reason string) {
	m.Run.Close(reason)
	m.once.Do(func() {
		m.mu.Lock()
		e := m.entry
		if p, c, ok := m.tun.usage(); ok {
			e.PromptTokens, e.CompletionTokens = p, c
		}
		m.mu.Unlock()
		e.Duration = m.h.cfg.Now().Sub(e.Time)
		e.Outcome = outcomes[reason]
		if e.Outcome == "" {
			e.Outcome = strings.ReplaceAll(reason, " ", "_")
		}
		m.h.cfg.Ledger.Record(e)
	})
}

// Bounds of what usageWatch keeps of a tunnel-path body: one SSE line (a
// usage chunk is small; longer lines are output) and the tail of a JSON
// answer (usage comes last in OpenAI's objects, after choices or data).
const (
	maxUsageLine = 64 << 10
	maxUsageTail = 64 << 10
)

// usageWatch finds the usage an OpenAI-compatible answer reports, as its
// bytes go by: in an SSE stream (read by package sse), the last event with
// a non-null "usage" (the include_usage chunk); in a JSON answer, the
// top-level "usage" object, read from the body's last maxUsageTail bytes.
type usageWatch struct {
	sse       bool
	events    sse.Reader // an event over maxUsageLine is skipped
	tail      []byte
	found     bool
	prompt    int64
	completed int64
}

func (u *usageWatch) write(p []byte) {
	if !u.sse {
		u.tail = append(u.tail, p...)
		if over := len(u.tail) - maxUsageTail; over > 0 {
			u.tail = append(u.tail[:0], u.tail[over:]...)
		}
		return
	}
	if u.events.MaxSize == 0 {
		u.events.MaxSize, u.events.SkipTooLong = maxUsageLine, true
	}
	_ = u.events.Feed(p, func(e sse.Event) error {
		if bytes.Contains(e.Data, []byte(`"usage"`)) {
			u.parse(bytes.TrimSpace(e.Data))
		}
		return nil
	})
}

func (u *usageWatch) parse(obj []byte) bool {
	var body usageJSONBody
	if json.Unmarshal(obj, &body) != nil || body.Usage == nil {
		return false
	}
	u.found, u.prompt, u.completed = true, body.Usage.PromptTokens, body.Usage.CompletionTokens
	return true
}

// usage returns what was found; for a JSON answer it reads the tail now:
// the whole body if it fit, else the object after its last `"usage":` key.
func (u *usageWatch) usage() (prompt, completion int64, ok bool) {
	if !u.sse && len(u.tail) > 0 && !u.parse(u.tail) {
		if i := bytes.LastIndex(u.tail, []byte(`"usage"`)); i > 0 && u.tail[i-1] != '\\' {
			rest := bytes.TrimLeft(u.tail[i+len(`"usage"`):], " \t\r\n")
			if r, ok := bytes.CutPrefix(rest, []byte(":")); ok {
				dec := json.NewDecoder(bytes.NewReader(r))
				var body usageJSONBody
				if dec.Decode(&body.Usage) == nil && body.Usage != nil {
					u.found, u.prompt, u.completed = true, body.Usage.PromptTokens, body.Usage.CompletionTokens
				}
			}
		}
	}
	return u.prompt, u.completed, u.found
}
