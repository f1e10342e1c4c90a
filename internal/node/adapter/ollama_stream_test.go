package adapter

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestParseLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want ollamaLine
		bad  bool
	}{
		{line: `{"message":{"role":"assistant","content":"hi"},"done":false}`, want: ollamaLine{Text: "hi"}},
		{line: `{"response":"yo","done":false}`, want: ollamaLine{Text: "yo"}},
		{line: `{"message":{"role":"assistant","content":"","thinking":"hmm"},"done":false}`, want: ollamaLine{Thinking: "hmm"}},
		{line: `{"response":"","thinking":"so","done":false}`, want: ollamaLine{Thinking: "so"}},
		{line: `{"message":{"role":"assistant","content":"a","thinking":"b"}}`, want: ollamaLine{Text: "a", Thinking: "b"}},
		{line: `{"done":true,"done_reason":"length","prompt_eval_count":3,"eval_count":9}`,
			want: ollamaLine{Done: true, DoneReason: "length", PromptTokens: 3, CompletionTokens: 9}},
		{line: `{"done":true,"prompt_eval_count":-3,"eval_count":1e12}`, want: ollamaLine{Done: true, CompletionTokens: 1<<31 - 1}},
		{line: `{"error":"boom"}`, want: ollamaLine{Err: "boom"}},
		{line: `{"error":{"message":"deep"}}`, want: ollamaLine{Err: "deep"}},
		{line: `{"error":42}`, want: ollamaLine{Err: "42"}},
		{line: `{"error":null,"error2":1}`, want: ollamaLine{}},
		{line: `{"error":false}`, want: ollamaLine{}},
		{line: "  {\"response\":\"x\"}\r", want: ollamaLine{Text: "x"}},
		{line: `{"message":{"content":"","tool_calls":[{"function":{"name":"f","arguments":{ "a" : 1 }}},{"id":"call_x","function":{"name":"g","arguments":"{\"b\":2}"}},{"function":{"name":"h"}}]}}`,
			want: ollamaLine{ToolCalls: []ollamaLineToolCall{{Name: "f", Arguments: `{"a":1}`}, {ID: "call_x", Name: "g", Arguments: `{"b":2}`}, {Name: "h", Arguments: "{}"}}}},
		{line: `[]`, bad: true},
		{line: `{"done":"yes"}`, bad: true},
		{line: `{`, bad: true},
		{line: ``, bad: true},
	} {
		got, err := parseLine([]byte(tc.line))
		if (err != nil) != tc.bad {
			t.Errorf("parseLine(%q) error %v, want bad=%v", tc.line, err, tc.bad)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("parseLine(%q) = %+v, want %+v", tc.line, got, tc.want)
		}
	}
}

// FuzzParseOllamaLine: parseLine never panics, its counters are never
// negative, and a parsed line re-encoded in Ollama's shape parses back to
// the same value.
func FuzzParseOllamaLine(f *testing.F) {
	f.Add([]byte(`{"model":"m","message":{"role":"assistant","content":"hi"},"done":false}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		l, err := parseLine(line)
		if err != nil {
			return
		}
		if l.PromptTokens < 0 || l.CompletionTokens < 0 {
			t.Fatalf("negative counters %+v", l)
		}
		type wire struct {
			Response        string `json:"response"`
			Thinking        string `json:"thinking,omitempty"`
			Done            bool   `json:"done"`
			DoneReason      string `json:"done_reason"`
			PromptEvalCount int32  `json:"prompt_eval_count"`
			EvalCount       int32  `json:"eval_count"`
			Error           string `json:"error,omitempty"`
		}
		again, err := json.Marshal(wire{l.Text, l.Thinking, l.Done, l.DoneReason, l.PromptTokens, l.CompletionTokens, l.Err})
		if err != nil {
			t.Fatal(err)
		}
		back, err := parseLine(again)
		if err != nil {
			t.Fatalf("re-encoded line %s does not parse: %v", again, err)
		}
		l.ToolCalls = nil // not re-encoded
		if !reflect.DeepEqual(back, l) {
			t.Fatalf("round trip %+v -> %s -> %+v", l, again, back)
		}
	})
}

// scanLineSeeds are stream lines as Ollama and iop sim write them, and the
// near misses scanLine must leave to decodeLine.
var scanLineSeeds = []string{
	`{"model":"m","created_at":"2026-01-01T00:00:00.123456789Z","message":{"role":"assistant","content":" token"},"done":false}`,
	`{"model":"m","created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":"","thinking":"hmm \"q\" \u00e9\ud83d\ude00"},"done":false}`,
	`{"model":"m","created_at":"x","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","total_duration":1234567,"load_duration":1,"prompt_eval_count":17,"prompt_eval_duration":2345,"eval_count":16,"eval_duration":345678}`,
	`{"model":"m","created_at":"x","response":"tok","thinking":"t","done":false}`,
	`{"model":"m","response":"","done":true,"done_reason":"length","prompt_eval_count":1e3,"eval_count":-4}`,
	`{"model":"m","response":"a","message":{"content":"b"},"done":false}`,
	`{"model":"m","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]},"done":false}`,
	`{"error":"model not found"}`,
	`{"error":{"message":"boom"}}`,
	`{"message":{"Content":"case"},"done":false}`,
	`{"Message":{"content":"case"},"done":false}`,
	`{"message":{"content":"a"},"message":{"thinking":"b"}}`,
	`{"response":"a","response":"b"}`,
	`{"done":"true"}`,
	`{"done":null,"response":null}`,
	`{"message":null}`,
	`{"prompt_eval_count":"17"}`,
	`{"prompt_eval_count":1e999}`,
	`{"eval_count":3000000000}`,
	`{"d\u006fne":true}`,
	"{\"response\":\"\xff\xfe bad utf-8\"}",
	`{"response":"x"} trailing`,
	` {"response":"x"}` + "\v",
	`{"response":"x","logprobs":[{"token":"x","logprob":-0.5}]}`,
	`[1,2]`,
	`{}`,
}

// TestScanLineEqualsDecodeOnSeeds: each seed parses the same by parseLine
// (scanLine first) as by decodeLine alone, and the plain stream lines are
// the ones scanLine reads itself.
func TestScanLineEqualsDecodeOnSeeds(t *testing.T) {
	scanned := 0
	for _, s := range scanLineSeeds {
		checkScanLine(t, []byte(s))
		if _, ok := scanLine([]byte(s)); ok {
			scanned++
		}
	}
	if _, ok := scanLine([]byte(scanLineSeeds[0])); !ok {
		t.Error("a token line was left to decodeLine")
	}
	if _, ok := scanLine([]byte(scanLineSeeds[2])); !ok {
		t.Error("the final line was left to decodeLine")
	}
	if scanned == len(scanLineSeeds) {
		t.Error("scanLine read every seed, near misses too")
	}
}

// FuzzScanLineEqualsDecode: whatever line scanLine reads, it reads as
// decodeLine does.
func FuzzScanLineEqualsDecode(f *testing.F) {
	for _, s := range scanLineSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) { checkScanLine(t, line) })
}

func checkScanLine(t *testing.T, line []byte) {
	t.Helper()
	got, gerr := parseLine(line)
	want, werr := decodeLine(line)
	if (gerr == nil) != (werr == nil) || !reflect.DeepEqual(got, want) {
		t.Fatalf("line %q: parseLine %+v, %v; decodeLine %+v, %v", line, got, gerr, want, werr)
	}
}
