package api

import (
	"strings"
	"testing"
)

func scan(sse bool, chunks ...string) (in, out int, ok bool, content int) {
	u := &usageScanner{sse: sse}
	for _, c := range chunks {
		content += u.write([]byte(c))
	}
	in, out, ok = u.end()
	return in, out, ok, content
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
	long := "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1},\"pad\":\"" + strings.Repeat("x", maxUsageScanBytes) + "\"}\n\n"
	in, out, ok, _ := scan(true, long[:100], long[100:], "data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\n\n")
	if !ok || in != 5 || out != 6 {
		t.Fatalf("after an overlong line: %d/%d %v", in, out, ok)
	}
	if in, out, ok, _ := scan(true, long); ok {
		t.Fatalf("an overlong event was scanned: %d/%d", in, out)
	}
	if _, _, ok, _ := scan(false, `{"usage":{"prompt_tokens":1,"completion_tokens":1},"pad":"`+strings.Repeat("x", maxUsageScanBytes)+`"}`); ok {
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
