package benchrun

import (
	"container/heap"
	"slices"
	"time"
)

// llamaSwapPhase is the reference row: what llama-swap's policy would do
// with the same trace on one host, simulated in virtual time (no
// processes). The host is one provider of the benchmark: it holds
// cfg.MaxLoaded models at once (llama-swap's swap group when 1), each
// model's server answers cfg.Capacity requests at a time and queues the
// rest in arrival order, a load takes cfg.LoadTime and an answer
// cfg.Service. The scheduling follows llama-swap's FIFO scheduler
// (internal/router/scheduler/fifo.go): a request for a ready model that
// needs no eviction is served at once, even past queued requests; one for
// a model being loaded joins that load; one whose load would evict a
// model with requests in flight, or collide with a load under way, waits
// in a FIFO queue, looked at again when a load ends or a model's last
// request ends; otherwise it starts a load, evicting the least recently
// used model when the host is full. Latency is arrival to whole answer;
// QueueWait arrival to the grant. It has no over-capacity by construction.
func llamaSwapPhase(cfg ResidencyConfig, trace []traced) ResidencyPhase {
	sim := &swapSim{cfg: cfg, models: map[string]*swapModel{}, active: map[string]*swapLoad{}}
	for i, tr := range trace {
		sim.push(swapEvent{at: tr.at, kind: evArrive, req: i, model: tr.model})
	}
	lat := make([]time.Duration, len(trace))
	granted := make([]time.Duration, len(trace))
	sim.done = func(req int, at time.Duration) { lat[req] = at - trace[req].at }
	sim.granted = func(req int, at time.Duration) { granted[req] = at - trace[req].at }
	for sim.events.Len() > 0 {
		ev := heap.Pop(&sim.events).(swapEvent)
		sim.now = ev.at
		switch ev.kind {
		case evArrive:
			sim.arrive(swapReq{id: ev.req, model: ev.model})
		case evLoaded:
			sim.loaded(ev.model)
		case evServed:
			sim.served(ev.model)
		}
	}
	out := ResidencyPhase{Name: "llama_swap (simulated, 1 host)", Requests: len(trace), OK: len(trace), Loads: sim.loads, Evictions: sim.evictions}
	var steady []time.Duration
	for i, d := range lat {
		if trace[i].at >= cfg.Warmup {
			steady = append(steady, d)
		}
	}
	out.Latency, out.Steady, out.QueueWait = percentilesOf(lat), percentilesOf(steady), percentilesOf(granted)
	return out
}

type swapEventKind uint8

const (
	evArrive swapEventKind = iota
	evLoaded
	evServed
)

type swapEvent struct {
	at    time.Duration
	seq   int // ties in order of scheduling
	kind  swapEventKind
	req   int
	model string
}

type swapEvents []swapEvent

func (h swapEvents) Len() int { return len(h) }
func (h swapEvents) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].seq < h[j].seq
}
func (h swapEvents) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *swapEvents) Push(x any)   { *h = append(*h, x.(swapEvent)) }
func (h *swapEvents) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

type swapReq struct {
	id    int
	model string
}

// swapModel is one model's server on the host: running once loaded.
type swapModel struct {
	ready    bool
	inFlight int             // granted requests not answered yet
	slots    []time.Duration // when each of its Capacity slots is free
	lastUsed time.Duration
}

// swapLoad is a load under way: what it evicts and who waits for it.
type swapLoad struct {
	evict   []string
	waiters []swapReq
}

type swapSim struct {
	cfg     ResidencyConfig
	now     time.Duration
	seq     int
	events  swapEvents
	models  map[string]*swapModel // running (ready or loading)
	active  map[string]*swapLoad  // loads under way, by target
	queued  []swapReq
	done    func(req int, at time.Duration)
	granted func(req int, at time.Duration)

	loads, evictions int64
}

func (s *swapSim) push(ev swapEvent) {
	ev.seq = s.seq
	s.seq++
	heap.Push(&s.events, ev)
}

// evictionFor is the models a load of model must stop first: none when
// it runs or the host has room, else the least recently used other one.
func (s *swapSim) evictionFor(model string) []string {
	if s.models[model] != nil || len(s.models) < s.cfg.MaxLoaded {
		return nil
	}
	victim := ""
	for m, st := range s.models {
		if m == model || s.active[m] != nil {
			continue
		}
		if victim == "" || st.lastUsed < s.models[victim].lastUsed || st.lastUsed == s.models[victim].lastUsed && m < victim {
			victim = m
		}
	}
	if victim == "" { // every other model is being loaded
		for m := range s.active {
			if m != model && (victim == "" || m < victim) {
				victim = m
			}
		}
	}
	return []string{victim}
}

func (s *swapSim) collides(model string, evict []string) bool {
	for target, l := range s.active {
		if target == model {
			continue
		}
		if slices.Contains(evict, target) || slices.Contains(l.evict, model) || slices.ContainsFunc(evict, func(m string) bool { return slices.Contains(l.evict, m) }) {
			return true
		}
	}
	return false
}

func (s *swapSim) busy(evict []string) bool {
	return slices.ContainsFunc(evict, func(m string) bool { return s.models[m] != nil && s.models[m].inFlight > 0 })
}

// request is llama-swap's decision for one request (OnRequest); it
// reports whether the request left the queue (granted, joined or loading).
func (s *swapSim) request(r swapReq) bool {
	if l := s.active[r.model]; l != nil {
		l.waiters = append(l.waiters, r)
		return true
	}
	evict := s.evictionFor(r.model)
	m := s.models[r.model]
	switch {
	case m != nil && m.ready && len(evict) == 0 && !s.collides(r.model, evict):
		s.grant(r)
	case s.collides(r.model, evict), s.busy(evict):
		return false
	default:
		for _, v := range evict {
			delete(s.models, v)
			s.evictions++
		}
		s.models[r.model] = &swapModel{slots: make([]time.Duration, s.cfg.Capacity), lastUsed: s.now}
		s.active[r.model] = &swapLoad{evict: evict, waiters: []swapReq{r}}
		s.loads++
		s.push(swapEvent{at: s.now + s.cfg.LoadTime, kind: evLoaded, model: r.model})
	}
	return true
}

// arrive handles a new request: decided now, or queued (FIFO).
func (s *swapSim) arrive(r swapReq) {
	if !s.request(r) {
		s.queued = append(s.queued, r)
	}
}

// grant hands r to its ready model's server: the earliest free slot.
func (s *swapSim) grant(r swapReq) {
	m := s.models[r.model]
	m.inFlight++
	m.lastUsed = s.now
	i := 0
	for j, free := range m.slots {
		if free < m.slots[i] {
			i = j
		}
	}
	start := max(s.now, m.slots[i])
	m.slots[i] = start + s.cfg.Service
	s.granted(r.id, s.now)
	s.done(r.id, m.slots[i])
	s.push(swapEvent{at: m.slots[i], kind: evServed, model: r.model})
}

func (s *swapSim) loaded(model string) {
	l := s.active[model]
	delete(s.active, model)
	s.models[model].ready = true
	for _, w := range l.waiters {
		s.grant(w)
	}
	s.drain()
}

func (s *swapSim) served(model string) {
	m := s.models[model]
	if m == nil {
		return
	}
	if m.inFlight--; m.inFlight == 0 {
		s.drain()
	}
}

// drain looks at the queue again, in order (drainQueue).
func (s *swapSim) drain() {
	pending := s.queued
	s.queued = nil
	for _, r := range pending {
		if !s.request(r) {
			s.queued = append(s.queued, r)
		}
	}
}
