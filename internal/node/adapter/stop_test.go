package adapter

import (
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// TestStopMatcher: text fed in pieces comes out cut before the earliest
// stop sequence, however it was split, and nothing at or past it is ever
// released.
func TestStopMatcher(t *testing.T) {
	for _, tc := range []struct {
		stops   []string
		pieces  []string
		want    string
		matched string
	}{
		{nil, []string{"a", "b"}, "ab", ""},
		{[]string{""}, []string{"a", "b"}, "ab", ""},
		{[]string{"END"}, []string{"hello E", "N", "D world"}, "hello ", "END"},
		{[]string{"END"}, []string{"hello EN", "Xtra"}, "hello ENXtra", ""},
		{[]string{"b c", "c"}, []string{"a b", " c d"}, "a ", "b c"},
		{[]string{"c", "b c"}, []string{"a b", " c d"}, "a ", "b c"},
		{[]string{"xy", "x"}, []string{"axy"}, "a", "x"}, // the first to end
		{[]string{"a  ", " "}, []string{"a  "}, "a", " "},
		{[]string{"\n\n"}, []string{"line\n", "\nnext"}, "line", "\n\n"},
		{[]string{"é!"}, []string{"caf\xc3", "\xa9!"}, "caf", "é!"},
	} {
		m := newStopMatcher(tc.stops)
		var out strings.Builder
		matched := ""
		for _, p := range tc.pieces {
			s, seq := m.feed(p)
			out.WriteString(s)
			if seq != "" {
				matched = seq
				break
			}
		}
		if matched == "" {
			out.WriteString(m.flush())
		}
		if out.String() != tc.want || matched != tc.matched {
			t.Errorf("%q in %q: %q, %q; want %q, %q", tc.stops, tc.pieces, out.String(), matched, tc.want, tc.matched)
		}
	}
}

// TestStopMatcher_AnySplit: for any text, stop sequences and split, the
// text released is the text before the match that ends first (all of it
// when none matches), and no piece's output goes past it.
func TestStopMatcher_AnySplit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		alpha := rapid.SampledFrom([]string{"a", "b", "c", " "})
		word := func(label string, minLen, maxLen int) string {
			return strings.Join(rapid.SliceOfN(alpha, minLen, maxLen).Draw(t, label), "")
		}
		text := word("text", 0, 40)
		stops := []string{word("stop1", 1, 4), word("stop2", 1, 4)}
		want, wantSeq := text, ""
		end := -1
		for _, s := range stops {
			i := strings.Index(text, s)
			if i >= 0 && (end < 0 || i+len(s) < end || i+len(s) == end && i < len(want)) {
				want, wantSeq, end = text[:i], s, i+len(s)
			}
		}
		m := newStopMatcher(stops)
		var out strings.Builder
		seq := ""
		for rest := text; rest != "" && seq == ""; {
			n := rapid.IntRange(1, len(rest)).Draw(t, "piece")
			var s string
			s, seq = m.feed(rest[:n])
			out.WriteString(s)
			if !strings.HasPrefix(want, out.String()) {
				t.Fatalf("released %q, beyond %q", out.String(), want)
			}
			rest = rest[n:]
		}
		if seq == "" {
			out.WriteString(m.flush())
		}
		if out.String() != want || seq != wantSeq {
			t.Fatalf("%q with %q: %q %q, want %q %q", text, stops, out.String(), seq, want, wantSeq)
		}
	})
}
