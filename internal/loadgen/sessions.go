package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Workloads (Config.Workload).
const (
	// WorkloadFixed sends the same one-message request every time (the
	// default).
	WorkloadFixed = "fixed"
	// WorkloadSessions runs Config.Sessions conversations of Config.Turns
	// turns each: every turn appends the previous answer and a new user
	// message of Config.TurnTokens words, after a system prompt of
	// Config.SharedPrefixTokens words that all sessions share. The
	// conversation of a session is sent again, whole, at each turn, as a
	// chat client does, so turn k's prompt is a prefix of turn k+1's.
	WorkloadSessions = "sessions"
)

// DefaultTurnTokens is the length of one user message of the sessions
// workload, in words.
const DefaultTurnTokens = 64

// sessionWords is the vocabulary of the sessions workload's text.
var sessionWords = strings.Fields("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone cloud light")

// wordsFrom returns n words drawn from rng.
func wordsFrom(rng *rand.Rand, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = sessionWords[rng.IntN(len(sessionWords))]
	}
	return strings.Join(w, " ")
}

// session is one conversation of the sessions workload. Only the worker
// that took it from the pool touches it.
type session struct {
	id       int
	turn     int // turns sent so far
	messages []map[string]string
}

// sessionPool hands sessions to workers in round-robin order: a session
// whose turn was answered goes to the back, so sessions interleave as the
// clients of a chat service do.
type sessionPool struct {
	cfg   Config
	ready chan *session
	left  atomic.Int64 // sessions not finished
	done  chan struct{}
	once  sync.Once
}

func newSessionPool(cfg Config) *sessionPool {
	p := &sessionPool{cfg: cfg, ready: make(chan *session, cfg.Sessions), done: make(chan struct{})}
	shared := wordsFrom(rand.New(rand.NewPCG(0, 0)), cfg.SharedPrefixTokens)
	for i := range cfg.Sessions {
		s := &session{id: i}
		if shared != "" {
			s.messages = append(s.messages, map[string]string{"role": "system", "content": shared})
		}
		p.ready <- s
	}
	p.left.Store(int64(cfg.Sessions))
	if cfg.Sessions == 0 {
		close(p.done)
	}
	return p
}

// next returns the body of s's next turn: its conversation with a new user
// message appended.
func (p *sessionPool) next(s *session) []byte {
	rng := rand.New(rand.NewPCG(uint64(s.id)+1, uint64(s.turn)))
	user := fmt.Sprintf("session %d turn %d: %s", s.id, s.turn, wordsFrom(rng, p.cfg.TurnTokens))
	s.messages = append(s.messages, map[string]string{"role": "user", "content": user})
	body := map[string]any{"model": p.cfg.Model, "messages": s.messages, "stream": p.cfg.Stream}
	addOptions(body, p.cfg)
	b, err := json.Marshal(body)
	if err != nil {
		panic(err) // strings, bools and ints only
	}
	return b
}

// answered appends the answer of s's turn and puts s back, or finishes it
// after its last turn.
func (p *sessionPool) answered(s *session, answer string) {
	s.messages = append(s.messages, map[string]string{"role": "assistant", "content": answer})
	s.turn++
	if s.turn < p.cfg.Turns {
		p.ready <- s
		return
	}
	if p.left.Add(-1) == 0 {
		p.once.Do(func() { close(p.done) })
	}
}

// sessionsLoop runs Concurrency workers over the session pool until every
// session had its turns, or done.
func (g *generator) sessionsLoop(ctx context.Context, done <-chan struct{}) {
	pool := newSessionPool(g.cfg)
	var wg sync.WaitGroup
	for range g.cfg.Concurrency {
		wg.Go(func() {
			for {
				var s *session
				select {
				case s = <-pool.ready:
				case <-pool.done:
					return
				case <-done:
					return
				case <-ctx.Done():
					return
				}
				if stopped(done) || ctx.Err() != nil {
					return
				}
				g.inFlight.Add(1)
				smp := g.req.doBody(ctx, time.Now(), pool.next(s))
				g.inFlight.Add(-1)
				g.rec.add(smp)
				pool.answered(s, smp.text)
			}
		})
	}
	wg.Wait()
}
