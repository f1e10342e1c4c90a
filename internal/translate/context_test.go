package translate

import (
	"bytes"
	"compress/flate"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// A context iop gives reads back as the same conversation; every integer
// but the first is below 2^24, and the first is no real token id.
func TestContextRoundTrip(t *testing.T) {
	for _, turns := range [][]Turn{
		{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "hello there"}},
		{{Role: "user", Content: ""}, {Role: "assistant", Content: ""}},
		{{Role: "user", Content: strings.Repeat("é∑ ", 5000)}, {Role: "assistant", Content: "\x00\n\"quoted\""}},
		{},
	} {
		ctx := EncodeContext(turns)
		if ctx[0] != contextMagic {
			t.Fatalf("first value %d", ctx[0])
		}
		ids := make([]int64, len(ctx))
		for i, v := range ctx {
			if i > 0 && (v < 0 || v >= 1<<24) {
				t.Fatalf("value %d at %d out of range", v, i)
			}
			ids[i] = int64(v)
		}
		got, err := DecodeContext(ids)
		if err != nil || !slices.Equal(got, turns) && len(turns) > 0 {
			t.Fatalf("DecodeContext = %v, %v; want %v", got, err, turns)
		}
	}
}

// A context iop did not give (a real Ollama's token ids) or a damaged one
// is ErrForeignContext, never a panic or a made-up conversation.
func TestDecodeForeignContext(t *testing.T) {
	good := EncodeContext([]Turn{{Role: "user", Content: "hi"}})
	ids := func(v []int) []int64 {
		out := make([]int64, len(v))
		for i, x := range v {
			out[i] = int64(x)
		}
		return out
	}
	bomb := func() []int64 {
		// 32 MiB of zeros deflate to a few KiB: over the 16 MiB bound.
		var buf bytes.Buffer
		zw, _ := flate.NewWriter(&buf, flate.BestCompression)
		zw.Write([]byte(`[{"role":"user","content":"`))
		zw.Write(make([]byte, 32<<20))
		zw.Close()
		p := buf.Bytes()
		out := []int64{contextMagic, int64(len(p))}
		for i := 0; i < len(p); i += 3 {
			v := int64(0)
			for j := range 3 {
				v <<= 8
				if i+j < len(p) {
					v |= int64(p[i+j])
				}
			}
			out = append(out, v)
		}
		return out
	}()
	for name, ctx := range map[string][]int64{
		"ollama token ids":   {128006, 882, 128007, 271, 6151, 128009},
		"empty":              {},
		"magic alone":        {contextMagic},
		"wrong length":       append(ids(good[:2]), ids(good[2:])[1:]...),
		"value out of range": append(ids(good[:len(good)-1]), 1<<24),
		"negative":           append(ids(good[:len(good)-1]), -1),
		"not deflate":        {contextMagic, 3, 0xffffff},
		"bomb":               bomb,
	} {
		if turns, err := DecodeContext(ctx); !errors.Is(err, ErrForeignContext) {
			t.Errorf("%s: DecodeContext = %v, %v; want ErrForeignContext", name, turns, err)
		}
	}
}

// FuzzDecodeContext: a context is client input; decoding never panics,
// and what it accepts is user and assistant turns only.
func FuzzDecodeContext(f *testing.F) {
	f.Add([]byte{}, int64(0))
	good := EncodeContext([]Turn{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "yo"}})
	var seed []byte
	for _, v := range good[2:] {
		seed = append(seed, byte(v>>16), byte(v>>8), byte(v))
	}
	f.Add(seed, int64(good[1]))
	f.Fuzz(func(t *testing.T, payload []byte, n int64) {
		ctx := []int64{contextMagic, n}
		for i := 0; i+2 < len(payload); i += 3 {
			ctx = append(ctx, int64(payload[i])<<16|int64(payload[i+1])<<8|int64(payload[i+2]))
		}
		turns, err := DecodeContext(ctx)
		if err != nil {
			if !errors.Is(err, ErrForeignContext) {
				t.Fatalf("error %v", err)
			}
			return
		}
		for _, tr := range turns {
			if tr.Role != "user" && tr.Role != "assistant" {
				t.Fatalf("accepted role %q", tr.Role)
			}
		}
	})
}

// /api/generate with a context iop gave continues that conversation: its
// turns come between the system message and the new prompt, and
// Request.Conversation is them and the new prompt. A context of another
// server, or one on a raw or suffix request, is refused naming "context".
func TestFromOllamaGenerateContext(t *testing.T) {
	ctx, _ := json.Marshal(EncodeContext([]Turn{{Role: "user", Content: "my name is Ada"}, {Role: "assistant", Content: "hello Ada"}}))
	req, err := FromOllamaGenerate([]byte(`{"model":"m","system":"be brief","prompt":"what is my name?","context":` + string(ctx) + `}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Messages []Turn `json:"messages"`
	}
	if err := json.Unmarshal(req.Body, &body); err != nil {
		t.Fatal(err)
	}
	want := []Turn{{"system", "be brief"}, {"user", "my name is Ada"}, {"assistant", "hello Ada"}, {"user", "what is my name?"}}
	if !slices.Equal(body.Messages, want) {
		t.Errorf("messages %v, want %v", body.Messages, want)
	}
	if wantConv := want[1:]; !slices.Equal(req.Conversation, wantConv) {
		t.Errorf("conversation %v, want %v", req.Conversation, wantConv)
	}
	// Without a context the conversation is the prompt alone; raw and
	// suffix requests have none.
	if req, err := FromOllamaGenerate([]byte(`{"model":"m","prompt":"hi"}`)); err != nil || !slices.Equal(req.Conversation, []Turn{{"user", "hi"}}) {
		t.Errorf("no context: %v %v", req.Conversation, err)
	}
	for _, body := range []string{`{"model":"m","prompt":"hi","raw":true}`, `{"model":"m","prompt":"hi","suffix":"end"}`} {
		if req, err := FromOllamaGenerate([]byte(body)); err != nil || req.Conversation != nil {
			t.Errorf("%s: conversation %v %v, want none", body, req.Conversation, err)
		}
	}
	for body, want := range map[string]string{
		`{"model":"m","prompt":"hi","context":[128006,882,128007]}`:              "not a context iop gave",
		`{"model":"m","prompt":"hi","raw":true,"context":` + string(ctx) + `}`:   "raw mode does not support",
		`{"model":"m","prompt":"hi","suffix":"x","context":` + string(ctx) + `}`: "suffix",
	} {
		_, err := FromOllamaGenerate([]byte(body))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "context" || !strings.Contains(fe.Message, want) {
			t.Errorf("%s: %v, want a context error saying %q", body, err, want)
		}
	}
}
