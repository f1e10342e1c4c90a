package translate

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"os"
	"reflect"
	"testing"
	"unicode/utf8"

	"iop/internal/jsonscan"
)

// stringSeeds are JSON strings written in every way a client may write
// them: escapes json.Marshal writes and others (\/, \u for ASCII, upper
// case hex, surrogate pairs, lone surrogates), HTML characters raw and
// escaped, U+2028, invalid UTF-8.
var stringSeeds = []string{
	`""`, `"plain"`, `"a\nb\tc\"d\\e\rf\bg\fh"`, `"\u0001\u001f\u007f"`, `"\u001F"`,
	`"\/"`, `"\u0041"`, `"<a href=\"x\">&amp;</a>"`, `"\u003c\u003e\u0026"`, `"\u003C"`,
	`"é → “q”"`, `"\u00e9"`, `"\ud83d\ude00"`, `"😀"`, `"\ud83d"`, `"\ude00x"`,
	"\"\u2028\u2029\"", `"\u2028"`, "\"\xff\xfe\"", "\"a\xc3\"", "\"\xed\xa0\x80\"",
	`"\u0008\u000c\u000a\u000d\u0009"`, `"\ufffd"`, "\"\xef\xbf\xbd\"",
}

// marshalString is json.Marshal of s.
func marshalString(t testing.TB, s string) []byte {
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkString checks appendRawString and appendJSONString against
// json.Marshal for the JSON string raw, when it is one.
func checkString(t *testing.T, raw []byte) {
	if len(raw) == 0 || raw[0] != '"' {
		return
	}
	if end, _ := jsonscan.String(raw, 0); end != len(raw) {
		return
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("%q: jsonscan takes it, encoding/json: %v", raw, err)
	}
	want := marshalString(t, s)
	if got := appendRawString([]byte("x"), raw); !bytes.Equal(got[1:], want) {
		t.Fatalf("appendRawString(%q) = %q, json.Marshal of its value %q", raw, got[1:], want)
	}
	if canonical(raw) && !bytes.Equal(raw, want) {
		t.Fatalf("canonical(%q), but json.Marshal writes %q", raw, want)
	}
	// The raw bytes between the quotes as a Go string (invalid UTF-8 kept).
	inner := string(raw[1 : len(raw)-1])
	if got, want := appendJSONString(nil, inner), marshalString(t, inner); !bytes.Equal(got, want) {
		t.Fatalf("appendJSONString(%q) = %q, json.Marshal %q", inner, got, want)
	}
	if got, want := appendJSONString(nil, []byte(inner)), marshalString(t, inner); !bytes.Equal(got, want) {
		t.Fatalf("appendJSONString([]byte %q) = %q, json.Marshal %q", inner, got, want)
	}
}

func TestAppendRawStringIsMarshal(t *testing.T) {
	for _, s := range stringSeeds {
		checkString(t, []byte(s))
	}
}

// FuzzAppendRawString: a JSON string copied or transcoded by
// appendRawString is what json.Marshal writes of its value; appendJSONString
// is json.Marshal.
func FuzzAppendRawString(f *testing.F) {
	for _, s := range stringSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkString(t, raw)
		checkString(t, append(append([]byte{'"'}, raw...), '"'))
	})
}

// FuzzAppendCompactRaw: appendCompactRaw is json.Marshal of a
// json.RawMessage, errors included.
func FuzzAppendCompactRaw(f *testing.F) {
	for _, s := range []string{`{"a": [1, 2 ,{"b":"<&>"}] }`, ` "x\u2028" `, "[\"\u2028\u2029\"]", `{"a":"\" <"}`, `tru`, `{} {}`, ` `, `[1,]`, `"\"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if _, _, ok := validJSON(raw); ok != json.Valid(raw) {
			t.Fatalf("validJSON(%q) = %v, json.Valid %v", raw, ok, !ok)
		}
		want, werr := json.Marshal(json.RawMessage(raw))
		got, err := appendCompactRaw(nil, raw)
		if (err != nil) != (werr != nil) || err == nil && !bytes.Equal(got, want) {
			t.Fatalf("appendCompactRaw(%q) = %q, %v; json.Marshal %q, %v", raw, got, err, want, werr)
		}
	})
}

// refMessage is ollamaMessage without its own encoder: what json.Marshal
// writes of it is the reference for appendJSON.
type refMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	Images    []string         `json:"images,omitempty"`
	ToolCalls []OllamaToolCall `json:"tool_calls,omitempty"`
	ToolName  string           `json:"tool_name,omitempty"`
	Thinking  string           `json:"thinking,omitempty"`
}

// refChat is ollamaChatRequest with refMessages.
type refChat struct {
	Model    string          `json:"model"`
	Messages []refMessage    `json:"messages,omitempty"`
	Stream   bool            `json:"stream"`
	Format   json.RawMessage `json:"format,omitempty"`
	Options  *ollamaOptions  `json:"options,omitempty"`
	Tools    json.RawMessage `json:"tools,omitempty"`
	Think    json.RawMessage `json:"think,omitempty"`
}

// checkChatScan checks that scanChatRequest decodes body as json.Unmarshal
// does whenever it takes it, and that the Ollama body ToOllamaChatRequest
// writes is json.Marshal's of the same request.
func checkChatScan(t *testing.T, body []byte) {
	var scanned, decoded openAIChatRequest
	ok := scanChatRequest(body, &scanned)
	err := json.Unmarshal(body, &decoded)
	if ok && err != nil {
		t.Fatalf("%q: scanChatRequest takes it, json.Unmarshal: %v", body, err)
	}
	if ok && !reflect.DeepEqual(scanned, decoded) {
		t.Fatalf("%q: scanChatRequest\n%+v\njson.Unmarshal\n%+v", body, scanned, decoded)
	}
	chat, err := ToOllamaChatRequest(body, "m", nil)
	if err != nil {
		return
	}
	var out ollamaChatRequest
	if err := json.Unmarshal(chat.Body, &out); err != nil {
		t.Fatalf("%q: the Ollama body %q is not JSON: %v", body, chat.Body, err)
	}
	ref := refChat{Model: out.Model, Stream: out.Stream, Format: out.Format, Options: out.Options, Tools: out.Tools, Think: out.Think}
	for _, m := range out.Messages {
		ref.Messages = append(ref.Messages, refMessage{m.Role, m.Content, m.Images, m.ToolCalls, m.ToolName, m.Thinking})
	}
	want, err := json.Marshal(ref)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(chat.Body, want) {
		t.Fatalf("%q:\nToOllamaChatRequest %s\njson.Marshal        %s", body, chat.Body, want)
	}
}

// chatSeeds are chat completions bodies for FuzzChatScanEqualsDecode: the
// shapes the scan takes and those it leaves to encoding/json.
var chatSeeds = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
	`{"messages":[{"role":"system","content":"<b>\u00e9\/</b>"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"max_tokens":5,"stop":["a","b"],"temperature":0.5}`,
	`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`,
	`{"messages":[{"role":"user","content":"a","reasoning_content":"think","reasoning":"r"}],"reasoning_effort":"low"}`,
	`{"Messages":[{"role":"user","content":"a"}]}`,
	`{"messages":[{"ROLE":"user","content":"a"}]}`,
	`{"messages":[{"role":"user","content":"a","content":"b"}]}`,
	`{"messages":[{"role":"user","content":"a"}],"messages":[]}`,
	`{"messages":[{"r\u006fle":"user","content":"a"}]}`,
	`{"messages":[null]}`, `{"messages":null}`, `{"messages":[{"role":1}]}`, `{"messages":[{"role":null,"content":"a"}]}`,
	`{"messages":[{"role":"user","content":"a"}],"max_tokens":"5"}`, `{"messages":[{"role":"user","content":"a"}],"n":2}`,
	`{"messages":[{"role":"user","content":"a"}],"response_format":{"type":"json_schema","json_schema":{"schema":{"a":"<"}}}}`,
	`{"messages":[{"role":"user","content":"a"}],"reasoning":{"effort":"high"},"tool_choice":"none","parallel_tool_calls":true}`,
	`{"messages":[{"role":"user","content":"a\u2028"}]} `, `[]`, `{"messages":[{"role":"user","content":"a"}]`, `null`,
	`{"messages":[{"role":"us\"er","name":"n\u00e9","content":" \"x\" "}],"logprobs":false,"top_logprobs":null,"seed":1}`,
	`{"messages":[{"role":"assistant","content":"","tool_calls":[]},{"role":"assistant","tool_calls":null}]}`,
	`{"messages":[{"role":"assistant","tool_calls":[{"id":"","function":null},{"type":"function","function":{"arguments":" {} ","name":"f","x":1}}]}]}`,
	`{"messages":[{"role":"assistant","tool_calls":[{"id":"a","id":"b","function":{"name":"f"}}]}]}`,
	`{"messages":[{"role":"assistant","tool_calls":[{"ID":"a","function":{"Name":"f"}}]}]}`,
	`{"messages":[{"role":"assistant","tool_calls":[null,{"function":{"name":"f","arguments":"{\"a\":\"<\u2028>\"}"}}]}]}`,
	`{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":1}}]}]}`,
	`{"messages":[{"role":"assistant","tool_calls":[{"function":[]}]}]}`,
}

// FuzzChatScanEqualsDecode: scanChatRequest decodes as json.Unmarshal does
// whenever it takes a body, and the Ollama body is json.Marshal's.
func FuzzChatScanEqualsDecode(f *testing.F) {
	for _, s := range chatSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) { checkChatScan(t, body) })
}

func TestChatScanEqualsDecodeOnSeeds(t *testing.T) {
	for _, s := range chatSeeds {
		checkChatScan(t, []byte(s))
	}
	agent, err := os.ReadFile("../edge/testdata/agent_100k.json")
	if err != nil {
		t.Fatal(err)
	}
	checkChatScan(t, agent)
	var in openAIChatRequest
	if !scanChatRequest(agent, &in) {
		t.Fatal("the agent's request is not read in place")
	}
}

// TestHTMLSafe8: eight bytes are safe at once exactly when each one is.
func TestHTMLSafe8(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for n := range 1<<20 + 256*8 {
		var b [8]byte
		if n < 256*8 {
			copy(b[:], "abcdefgh")
			b[n%8] = byte(n / 8)
		} else {
			binary.LittleEndian.PutUint64(b[:], r.Uint64()&^(hi8*uint64(n%2)))
		}
		want := true
		for _, c := range b {
			want = want && c < utf8.RuneSelf && htmlSafe[c]
		}
		if got := htmlSafe8(binary.LittleEndian.Uint64(b[:])); got != want {
			t.Fatalf("htmlSafe8(%q) = %v, want %v", b, got, want)
		}
	}
}
