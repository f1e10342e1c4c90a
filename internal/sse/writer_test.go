package sse

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestAppendEvent(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, data, want string
	}{
		{"", `{"a":1}`, "data: {\"a\":1}\n\n"},
		{"response.created", `{}`, "event: response.created\ndata: {}\n\n"},
		{"", "a\nb", "data: a\ndata: b\n\n"},
		{"", "a\r\nb\rc", "data: a\ndata: b\ndata: c\n\n"},
		{"", "", "data: \n\n"},
		{"", "a\n", "data: a\ndata: \n\n"},
	}
	for _, c := range cases {
		if got := string(AppendEvent(nil, c.name, []byte(c.data))); got != c.want {
			t.Errorf("AppendEvent(%q, %q) = %q, want %q", c.name, c.data, got, c.want)
		}
	}
	if got := string(AppendDone([]byte("x"))); got != "xdata: [DONE]\n\n" {
		t.Errorf("AppendDone = %q", got)
	}
}

// TestWriter_RoundTrip: whatever a Writer writes, a Reader reads back as
// the same events (data with its line ends made LF), whatever the data holds.
func TestWriter_RoundTrip(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		type sent struct{ name, data string }
		events := rapid.SliceOf(rapid.Custom(func(t *rapid.T) sent {
			return sent{
				name: rapid.SampledFrom([]string{"", "message", "response.output_text.delta", "error"}).Draw(t, "name"),
				data: rapid.StringMatching(`[a-z{}":\r\n é]{0,12}`).Draw(t, "data"),
			}
		})).Draw(t, "events")
		var body bytes.Buffer
		w := NewWriter(&body)
		if err := w.Comment("keepalive"); err != nil {
			t.Fatal(err)
		}
		for _, e := range events {
			if err := w.Event(e.name, []byte(e.data)); err != nil {
				t.Fatal(err)
			}
		}
		var got []sent
		err := ReadAll(&body, func(e Event) error {
			got = append(got, sent{e.Type, string(e.Data)})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(events) {
			t.Fatalf("read %d events, wrote %d: %q", len(got), len(events), got)
		}
		for i, e := range events {
			want := sent{e.name, strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(e.data)}
			if want.name == "" {
				want.name = "message"
			}
			if got[i] != want {
				t.Fatalf("event %d: read %q, wrote %q", i, got[i], e)
			}
		}
	})
}

type failWriter struct{ writes int }

func (f *failWriter) Write(p []byte) (int, error) { f.writes++; return 0, errors.New("broken") }

func TestWriter_Errors(t *testing.T) {
	t.Parallel()
	fw := &failWriter{}
	w := NewWriter(fw)
	if err := w.Done(); err == nil {
		t.Error("Done on a failing writer: no error")
	}
	if err := w.JSON("", func() {}); err == nil || fw.writes != 1 {
		t.Errorf("JSON of a func: err %v after %d writes, want an encoding error and no write", err, fw.writes)
	}
	var body bytes.Buffer
	if err := NewWriter(&body).JSON("x", map[string]int{"n": 1}); err != nil || body.String() != "event: x\ndata: {\"n\":1}\n\n" {
		t.Errorf("JSON wrote %q, %v", body.String(), err)
	}
}
