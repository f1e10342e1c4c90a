package chaos

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Load shape: 32 clients of key big on model m (sims a and b), 4 of key
// lim on model k (sim c). Each client sends one streamed chat request
// after another to the live edges in turn (a load balancer that routes
// away from an edge that is out).
const (
	bigClients = 32
	limClients = 4
)

// outcome is what became of one request.
type outcome struct {
	edge     string
	key      string // "big" or "lim"
	sent     time.Time
	header   time.Time // zero if no response
	end      time.Time
	status   int
	retry    bool   // Retry-After present
	complete bool   // a 200 stream that ended with [DONE]
	err      string // transport error or a broken stream
	body     string // the start of an error body
	excused  string // why it does not count: "killed" or "frozen"
}

// load runs the clients until stop and collects every outcome.
type load struct {
	r    *rig
	tag  string
	mu   sync.Mutex
	outs []outcome
	wg   sync.WaitGroup
	stop chan struct{}
}

func startLoad(r *rig) *load {
	l := &load{r: r, tag: r.tag, stop: make(chan struct{})}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 0}}
	for c := range bigClients + limClients {
		key, secret, model := "big", r.big, "m"
		if c >= bigClients {
			key, secret, model = "lim", r.lim, "k"
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := c; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				e := l.pick(i)
				if e == nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				o := l.ask(client, e, key, secret, model, fmt.Sprintf("%s c%d i%d", l.tag, c, i))
				l.mu.Lock()
				l.outs = append(l.outs, o)
				l.mu.Unlock()
				if o.status == http.StatusTooManyRequests || o.status == http.StatusServiceUnavailable || o.header.IsZero() {
					time.Sleep(200 * time.Millisecond) // honour the back-off a client would
				}
			}
		}()
	}
	return l
}

// pick is the i-th live edge in turn, nil if none is in.
func (l *load) pick(i int) *edge {
	n := len(l.r.edges)
	for j := range n {
		e := l.r.edges[(i+j)%n]
		if !e.out.Load() {
			return e
		}
	}
	return nil
}

// halt stops the clients and waits for their last requests.
func (l *load) halt() []outcome {
	close(l.stop)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]outcome(nil), l.outs...)
	sort.Slice(out, func(i, j int) bool { return out[i].sent.Before(out[j].sent) })
	return out
}

// answerWithin bounds the time to a response's headers; streamWithin the
// rest of a 200 stream (an answer takes about 200 ms).
const (
	answerWithin = queueTimeout + 5*time.Second
	streamWithin = 10 * time.Second
)

// ask sends one streamed chat request with a unique prompt.
func (l *load) ask(client *http.Client, e *edge, key, secret, model, prompt string) outcome {
	o := outcome{edge: e.name, key: key, sent: time.Now()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	headerTimer := time.AfterFunc(answerWithin, cancel)
	body := fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":%q}]}`, model, prompt)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	headerTimer.Stop()
	if err != nil {
		o.end = time.Now()
		o.err = err.Error()
		if ctx.Err() != nil {
			o.err = fmt.Sprintf("no answer within %s", answerWithin)
		}
		l.excuse(e, &o)
		return o
	}
	defer resp.Body.Close()
	o.header, o.status, o.retry = time.Now(), resp.StatusCode, resp.Header.Get("Retry-After") != ""
	streamTimer := time.AfterFunc(streamWithin, cancel)
	defer streamTimer.Stop()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var first strings.Builder
	for sc.Scan() {
		line := sc.Text()
		if resp.StatusCode != http.StatusOK {
			if first.Len() < 300 {
				first.WriteString(line)
			}
			continue
		}
		if line == "data: [DONE]" {
			o.complete = true
		}
		if strings.HasPrefix(line, `data: {"error"`) && first.Len() == 0 {
			first.WriteString(line)
		}
	}
	o.end = time.Now()
	o.body = first.String()
	if err := sc.Err(); err != nil {
		o.err = "stream: " + err.Error()
		if ctx.Err() != nil {
			o.err = fmt.Sprintf("stream not ended within %s", streamWithin)
		}
	}
	if resp.StatusCode == http.StatusOK && !o.complete && o.err == "" {
		o.err = "stream ended without [DONE]: " + o.body
	}
	if o.err != "" {
		l.excuse(e, &o)
	}
	return o
}

// excuse marks a failed request that a killed or frozen edge explains:
// nothing can answer from a dead or stopped process.
func (l *load) excuse(e *edge, o *outcome) {
	switch {
	case e.killed.Load():
		o.excused = "killed"
	case e.frozenDuring(o.sent, time.Now()):
		o.excused = "frozen"
	}
}
