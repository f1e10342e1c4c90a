package adapter

import "strings"

// stopMatcher finds a request's stop sequences in an answer's text as it
// streams, across delta boundaries: text is released only once no stop
// sequence can start in it, so no text at or past a stop sequence is
// ever sent. The zero value (no stop sequences) releases all text at
// once. Only one goroutine uses it.
type stopMatcher struct {
	stops []string // non-empty, in the request's order
	held  string   // the tail of the text that may start a stop sequence
}

// newStopMatcher is the matcher of stops; empty strings are left out
// (they match nothing, as OpenAI and Ollama treat them).
func newStopMatcher(stops []string) *stopMatcher {
	m := &stopMatcher{}
	for _, s := range stops {
		if s != "" {
			m.stops = append(m.stops, s)
		}
	}
	return m
}

// feed adds text and returns the text that can be sent now; matched is
// the stop sequence found, if any: then out is the text before it, and
// the answer ends there (nothing after it is sent). The match that ends
// first wins, as a model server that checks its stop sequences after
// each token stops at the first one completed; of two that end at one
// byte, the longer. The result does not depend on how the text was
// split.
func (m *stopMatcher) feed(text string) (out, matched string) {
	if len(m.stops) == 0 {
		return text, ""
	}
	s := m.held + text
	if at, stop := firstStop(s, m.stops); at >= 0 {
		m.held = ""
		return s[:at], stop
	}
	keep := 0 // the longest tail of s that is a proper prefix of a stop
	for _, stop := range m.stops {
		for k := min(len(stop)-1, len(s)); k > keep; k-- {
			if strings.HasSuffix(s, stop[:k]) {
				keep = k
				break
			}
		}
	}
	m.held = s[len(s)-keep:]
	return s[:len(s)-keep], ""
}

// flush returns the text held back, at the end of an answer that no stop
// sequence ended.
func (m *stopMatcher) flush() string {
	out := m.held
	m.held = ""
	return out
}

// firstStop is the stop sequence of stops whose first occurrence in s
// ends first (of two that end at one byte, the longer), and where it
// starts; -1 and "" when s contains none. Empty stop sequences match
// nothing.
func firstStop(s string, stops []string) (at int, matched string) {
	at, end := -1, -1
	for _, stop := range stops {
		i := strings.Index(s, stop)
		if stop == "" || i < 0 {
			continue
		}
		if e := i + len(stop); end < 0 || e < end || e == end && i < at {
			at, end, matched = i, e, stop
		}
	}
	return at, matched
}
