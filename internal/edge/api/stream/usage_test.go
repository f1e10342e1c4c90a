package stream

import (
	"encoding/json"
	"strings"
	"testing"
)

// tunnelJSON is a JSON chat answer as a provider sends it, with usage.
const tunnelJSON = `{"id":"chatcmpl-up","object":"chat.completion","created":1,"model":"served-model",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"from upstream"},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`

// observer is what the edge's observation does with what a FinalHold
// tells it: it keeps the answer's usage and counts its content events.
type observer struct {
	usage   UsageScanner
	content int
}

func (o *observer) TunnelEvent(ev *Event) {
	o.usage.Event(ev)
	if ev.Content {
		o.content++
	}
}

func (o *observer) TunnelBody(p []byte) { o.usage.Body(p) }

// scan reads chunks of a tunnel answer as the tunnel path reads them (a
// FinalHold whose one reader tells an observer) and returns the usage
// found and how many events carried content.
func scan(sse bool, chunks ...string) (in, out int, ok bool, content int) {
	o := &observer{}
	h := FinalHold{SSE: sse, Observer: o}
	for _, c := range chunks {
		h.Split([]byte(c))
	}
	in, out, ok = o.usage.End()
	return in, out, ok, o.content
}

func TestUsageScanner(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		sse     bool
		body    string
		in, out int
		ok      bool
		content int
	}{
		{"json usage", false, tunnelJSON, 4, 2, true, 0},
		{"json without usage", false, `{"choices":[]}`, 0, 0, false, 0},
		{"json usage null", false, `{"usage":null}`, 0, 0, false, 0},
		{"json not json", false, `<html>`, 0, 0, false, 0},
		{"sse final usage chunk", true,
			"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"content\": \"b\"}}]}\n\n" +
				"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n", 9, 2, true, 2},
		{"sse without usage", true, "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: [DONE]\n\n", 0, 0, false, 0},
		{"sse completions text and tool calls", true,
			"data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n" +
				"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n", 0, 0, false, 3},
		{"sse comments and other fields", true, ": ping\nevent: x\nid: 1\ndata:{\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n", 1, 1, true, 0},
		{"sse error event", true, "data: {\"error\":{\"message\":\"content\"}}\n\n", 0, 0, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Whole, and cut at every byte.
			splits := [][]string{{c.body}}
			for i := 1; i < len(c.body); i++ {
				splits = append(splits, []string{c.body[:i], c.body[i:]})
			}
			for _, chunks := range splits {
				in, out, ok, content := scan(c.sse, chunks...)
				if in != c.in || out != c.out || ok != c.ok || content != c.content {
					t.Fatalf("chunks %q: usage %d/%d %v, content %d; want %d/%d %v, %d", chunks, in, out, ok, content, c.in, c.out, c.ok, c.content)
				}
			}
		})
	}
}

// A line or body over the bound is skipped, not kept, and scanning goes on
// with the next line.
func TestUsageScannerBound(t *testing.T) {
	t.Parallel()
	long := "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1},\"pad\":\"" + strings.Repeat("x", MaxScanBytes) + "\"}\n\n"
	in, out, ok, _ := scan(true, long[:100], long[100:], "data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\n\n")
	if !ok || in != 5 || out != 6 {
		t.Fatalf("after an overlong line: %d/%d %v", in, out, ok)
	}
	if in, out, ok, _ := scan(true, long); ok {
		t.Fatalf("an overlong event was scanned: %d/%d", in, out)
	}
	if _, _, ok, _ := scan(false, `{"usage":{"prompt_tokens":1,"completion_tokens":1},"pad":"`+strings.Repeat("x", MaxScanBytes)+`"}`); ok {
		t.Fatal("an overlong JSON body was parsed")
	}
}

// Scanning never panics, and the result does not depend on how the bytes
// were cut.
func FuzzUsageScanner(f *testing.F) {
	f.Add(true, []byte("data: {\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n"), uint16(7))
	f.Add(true, []byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\n"), uint16(3))
	f.Add(false, []byte(tunnelJSON), uint16(40))
	f.Fuzz(func(t *testing.T, sse bool, body []byte, cut uint16) {
		i := int(cut) % (len(body) + 1)
		in1, out1, ok1, c1 := scan(sse, string(body))
		in2, out2, ok2, c2 := scan(sse, string(body[:i]), string(body[i:]))
		if in1 != in2 || out1 != out2 || ok1 != ok2 || c1 != c2 {
			t.Fatalf("cut at %d: %d/%d %v %d vs whole %d/%d %v %d", i, in2, out2, ok2, c2, in1, out1, ok1, c1)
		}
	})
}

// TestUsageScannerReadsTheTailOfALargeAnswer: a JSON answer larger than
// the whole body the scanner keeps (a big embeddings list) still yields its
// trailing usage, and a quoted "usage" inside a string is not taken for it.
func TestUsageScannerReadsTheTailOfALargeAnswer(t *testing.T) {
	body := `{"object":"list","data":[{"embedding":[` + strings.Repeat("0.125,", 200000) + `0.5]}],"note":"\"usage\":{\"prompt_tokens\":999}","usage":{"prompt_tokens":7,"total_tokens":7}}`
	if len(body) <= MaxScanBytes {
		t.Fatalf("the body (%d bytes) must outgrow what the scanner keeps whole (%d)", len(body), MaxScanBytes)
	}
	u := UsageScanner{}
	for p := body; p != ""; {
		n := min(len(p), 1000)
		u.Body([]byte(p[:n]))
		p = p[n:]
	}
	if p, c, ok := u.End(); !ok || p != 7 || c != 0 {
		t.Fatalf("usage = %d, %d, %v; want 7, 0, true", p, c, ok)
	}
	if _, _, ok, _ := scan(true, "data: {\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\"\"}}]}\r\n\r\ndata: [DONE]\r\n\r\n"); ok {
		t.Fatal("a stream without a usage chunk reported usage")
	}
}

// unmarshalUsage is parseUsage as encoding/json reads it: the whole
// document decoded.
func unmarshalUsage(doc []byte) (usageObject, bool) {
	var v struct {
		Usage *usageObject `json:"usage"`
	}
	if json.Unmarshal(doc, &v) == nil && v.Usage != nil {
		return *v.Usage, true
	}
	return usageObject{}, false
}

// usageDocs are documents on which reading usage in place could part from
// decoding the whole document.
var usageDocs = []string{
	tunnelJSON,
	`{"usage":{"prompt_tokens":3,"completion_tokens":4}}`,
	`{"USAGE":{"prompt_tokens":3}}`,
	`{"u\u0073age":{"prompt_tokens":3}}`,
	`{"uſage":{"prompt_tokens":3}}`,
	`{"usage":{"prompt_tokens":1},"usage":{"completion_tokens":2}}`,
	`{"usage":{"prompt_tokens":1},"Usage":null}`,
	`{"usage":null,"usage":{"completion_tokens":2}}`,
	`{"usage":{"prompt_tokens":"x"},"usage":{"completion_tokens":2}}`,
	`{"usage":{"prompt_tokens":1.5}}`,
	`{"usage":[1]}`,
	`{"usage":{"prompt_tokens":1}`,
	`{"usage":{"prompt_tokens":1}} x`,
	`[{"usage":{"prompt_tokens":1}}]`,
	`null`,
	`{"choices":[{"usage":{"prompt_tokens":1}}]}`,
	"{\"us\xffage\":{\"prompt_tokens\":1}}",
	`{"usage":{"prompt_tokens":1,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1}}}`,
}

// TestRegression_UsageIsReadInPlace: the usage of a JSON answer is read
// without decoding the whole answer (6 % of the edge's CPU at 32 clients
// went to json.Unmarshal of every non-streamed body), and what it reads is
// what decoding the whole document reads.
func TestRegression_UsageIsReadInPlace(t *testing.T) {
	for _, doc := range usageDocs {
		got, gotOK := parseUsage([]byte(doc))
		want, wantOK := unmarshalUsage([]byte(doc))
		if got != want || gotOK != wantOK {
			t.Errorf("%s: %+v %v; json.Unmarshal reads %+v %v", doc, got, gotOK, want, wantOK)
		}
	}
	body := []byte(tunnelJSON)
	if n := testing.AllocsPerRun(100, func() { parseUsage(body) }); n != 0 {
		t.Errorf("reading the usage of a JSON answer allocates %v times; want none", n)
	}
}

func FuzzParseUsage(f *testing.F) {
	for _, doc := range usageDocs {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		got, gotOK := parseUsage(doc)
		want, wantOK := unmarshalUsage(doc)
		if got != want || gotOK != wantOK {
			t.Fatalf("%q: %+v %v; json.Unmarshal reads %+v %v", doc, got, gotOK, want, wantOK)
		}
	})
}

func BenchmarkUsageScannerJSON(b *testing.B) {
	body := []byte(tunnelJSON)
	b.ReportAllocs()
	for b.Loop() {
		var u UsageScanner
		u.Body(body)
		if _, _, ok := u.End(); !ok {
			b.Fatal("no usage")
		}
	}
}
