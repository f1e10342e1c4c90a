package edge

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// samePromptBlocks fails t unless promptBlocks (the scan, or its
// fallback) gives body the blocks decoding it with encoding/json gives.
func samePromptBlocks(t interface {
	Helper()
	Fatalf(string, ...any)
}, op contract.Operation, body []byte) {
	t.Helper()
	got, want := promptBlocks(op, body), decodePromptBlocks(op, body)
	if !slices.Equal(got, want) {
		t.Fatalf("op %v, body %q: %d blocks, decoding gives %d", op, body, len(got), len(want))
	}
}

// jsonText draws a string of the characters prompts are made of: letters,
// spaces, newlines, tabs, quotes, backslashes, control bytes, non-ASCII
// runes, lone surrogates' replacement and invalid UTF-8.
func jsonText() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		parts := rapid.SliceOfN(rapid.SampledFrom([]string{
			"a", "hello ", "The quick brown fox. ", "\n", "\t", `"`, `\`, "\x01", "é", "→", "😀", "\xff", "\ufffd", "<b>&",
			strings.Repeat("x", 64), "\u2028", strings.Repeat("line one\n\t\"quoted\" é → \\ end. ", 3),
		}), 1, 40).Draw(t, "parts")
		return strings.Join(parts, "")
	})
}

// jsonString draws text as a JSON string, spelled as encoding/json writes
// it or with other escapes (\u for every rune, \/ , a surrogate pair, a
// lone surrogate).
func jsonString(t *rapid.T, label string) string {
	s := jsonText().Draw(t, label)
	switch rapid.IntRange(0, 3).Draw(t, label+"_spelling") {
	case 0:
		b, _ := json.Marshal(s)
		return string(b)
	case 1:
		var b strings.Builder
		b.WriteByte('"')
		for _, r := range s {
			if r > 0xffff {
				b.WriteString(`\ud83d\ude00`)
				continue
			}
			b.WriteString(`\u`)
			const hex = "0123456789abcDEF"
			b.WriteByte(hex[r>>12&0xf])
			b.WriteByte(hex[r>>8&0xf])
			b.WriteByte(hex[r>>4&0xf])
			b.WriteByte(hex[r&0xf])
		}
		b.WriteByte('"')
		return b.String()
	case 2:
		return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\t", `\t`, "\x01", `\u0001`, "/", `\/`).Replace(s) + `\/\ud800x\udc00"`
	default:
		// Raw bytes: invalid UTF-8 is kept as it is.
		return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\t", `\t`, "\x01", `\b`).Replace(s) + `"`
	}
}

// jsonValue draws any JSON value, nested up to depth.
func jsonValue(t *rapid.T, label string, depth int) string {
	kinds := []string{"string", "number", "literal", "array", "object"}
	if depth <= 0 {
		kinds = kinds[:3]
	}
	switch rapid.SampledFrom(kinds).Draw(t, label) {
	case "string":
		return jsonString(t, label+"_s")
	case "number":
		return rapid.SampledFrom([]string{"0", "-1", "1.5e3", "12345678901234567890", "-0.0"}).Draw(t, label+"_n")
	case "literal":
		return rapid.SampledFrom([]string{"true", "false", "null"}).Draw(t, label+"_l")
	case "array":
		n := rapid.IntRange(0, 3).Draw(t, label+"_len")
		var items []string
		for i := range n {
			items = append(items, jsonValue(t, label+"_"+string(rune('a'+i)), depth-1))
		}
		return "[" + strings.Join(items, ", ") + "]"
	default:
		n := rapid.IntRange(0, 3).Draw(t, label+"_len")
		var items []string
		for i := range n {
			items = append(items, `"k`+string(rune('a'+i))+`": `+jsonValue(t, label+"_"+string(rune('a'+i)), depth-1))
		}
		return "{" + strings.Join(items, ",") + "}"
	}
}

// members draws the members of an object: each of keys (with its value),
// now and then left out, given twice, spelled in another case, escaped,
// or with a value of another type, in any order.
func members(t *rapid.T, label string, keys []string, value func(key string) string) string {
	var ms []string
	for _, key := range keys {
		// rapid draws small numbers most: the common case is 0.
		odd := rapid.IntRange(0, 60).Draw(t, label+"_"+key)
		if odd == 60 {
			continue
		}
		v := value(key)
		switch odd {
		case 59:
			key = strings.ToUpper(key[:1]) + key[1:]
		case 58:
			key = fmt.Sprintf(`\u%04x`, key[0]) + key[1:]
		case 57:
			v = jsonValue(t, label+"_other", 2)
		case 56:
			key = key + "é"
		case 55:
			ms = append(ms, `"`+key+`":`+value(key))
		}
		ms = append(ms, `"`+key+`":`+rapid.SampledFrom([]string{"", " ", "\n\t"}).Draw(t, label+"_space")+v)
	}
	ms = rapid.Permutation(ms).Draw(t, label+"_order")
	return "{" + strings.Join(ms, ",") + "}"
}

// chatBodyOf draws a chat request body: tools, messages (objects, now and
// then null or another value) and other members, in any order, now and
// then with a key twice, or broken JSON.
func chatBodyOf(t *rapid.T) string {
	messageValue := func(key string) string {
		switch key {
		case "role":
			return `"` + rapid.SampledFrom([]string{"system", "user", "assistant", "tool"}).Draw(t, "role") + `"`
		case "content":
			if rapid.Bool().Draw(t, "content_parts") {
				return `[{"type":"text","text":` + jsonString(t, "part") + `}]`
			}
			return jsonString(t, "content")
		case "tool_calls":
			return `[{"id":"c1","type":"function","function":{"name":"f","arguments":` + jsonString(t, "args") + `}}]`
		case "tool_call_id":
			return jsonString(t, "call_id")
		}
		return jsonValue(t, "other", 1)
	}
	message := func(i int) string {
		switch 15 - rapid.IntRange(0, 15).Draw(t, "message_kind") {
		case 0:
			return "null"
		case 1:
			return jsonValue(t, "message_other", 1)
		}
		return members(t, "m", []string{"role", "content", "tool_calls", "tool_call_id", "name"}, messageValue)
	}
	topValue := func(key string) string {
		switch key {
		case "tools":
			return `[{"type":"function","function":{"name":"f","description":` + jsonString(t, "desc") + `,"parameters":{"type":"object"}}}]`
		case "messages":
			if rapid.IntRange(0, 10).Draw(t, "messages_null") == 10 {
				return "null"
			}
			n := 8 - rapid.IntRange(0, 8).Draw(t, "messages")
			var ms []string
			for i := range n {
				ms = append(ms, message(i))
			}
			return "[" + strings.Join(ms, ", ") + "]"
		}
		return jsonValue(t, "top_other", 2)
	}
	body := members(t, "top", []string{"model", "tools", "messages", "stream", "x"}, topValue)
	switch 20 - rapid.IntRange(0, 20).Draw(t, "breakage") {
	case 0:
		body = body[:rapid.IntRange(0, len(body)).Draw(t, "cut")]
	case 1:
		body = body + " x"
	case 2:
		body = "[" + body + "]"
	case 3:
		body = " \n" + body + " \t"
	}
	return body
}

// TestPromptBlocksScanEqualsDecode: reading a body in place gives the
// blocks decoding it with encoding/json gives, for any chat or completion
// body: strings with every kind of escape and invalid UTF-8, null and
// mistyped values, keys in another case, escaped or given twice, members
// in any order, broken JSON.
func TestPromptBlocksScanEqualsDecode(t *testing.T) {
	t.Parallel()
	read := 0
	rapid.Check(t, func(t *rapid.T) {
		body := []byte(chatBodyOf(t))
		samePromptBlocks(t, contract.OperationChat, body)
		if blocks, ok := scanPromptBlocks(contract.OperationChat, body); ok && len(blocks) > 0 {
			read++
		}
	})
	// About a third of the bodies have blocks read in place (the others
	// fall back, are broken, or are too short); none would mean the
	// generator no longer tests the scan.
	if read == 0 {
		t.Fatal("no body had blocks read in place")
	}
	rapid.Check(t, func(t *rapid.T) {
		prompt := func(key string) string {
			if key == "prompt" {
				return jsonValue(t, "prompt", 2)
			}
			return jsonValue(t, "other", 1)
		}
		samePromptBlocks(t, contract.OperationCompletion, []byte(members(t, "top", []string{"model", "prompt", "x"}, prompt)))
	})
}

// TestPromptBlocksScanEqualsDecodeOnCorpus: the same on an agent's 95 KiB
// request and on the edge's and the adapter's committed request bodies
// and fuzz corpora.
func TestPromptBlocksScanEqualsDecodeOnCorpus(t *testing.T) {
	t.Parallel()
	body := agentBody(t)
	if blocks, ok := scanPromptBlocks(contract.OperationChat, body); !ok || len(blocks) < 1000 {
		t.Fatalf("the agent body was not read in place (ok %v) or has %d blocks", ok, len(blocks))
	}
	samePromptBlocks(t, contract.OperationChat, body)
	files := 0
	for _, dir := range []string{"testdata", "api/testdata", "../node/adapter/testdata", "../translate/testdata"} {
		_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return nil
			}
			files++
			for _, op := range []contract.Operation{contract.OperationChat, contract.OperationCompletion} {
				samePromptBlocks(t, op, b)
				// A fuzz corpus file quotes its inputs: each line's
				// Go string too.
				for _, line := range strings.Split(string(b), "\n") {
					if i := strings.Index(line, `("`); i >= 0 && strings.HasSuffix(line, `")`) {
						if s, err := strconv.Unquote(line[i+1 : len(line)-1]); err == nil {
							samePromptBlocks(t, op, []byte(s))
						}
					}
				}
			}
			return nil
		})
	}
	if files < 10 {
		t.Fatalf("only %d corpus files read", files)
	}
}

// TestPrefixRouteOnlyWhenThereIsAChoice: with one provider serving the
// model, routing by prefix does not read the body (no blocks: nothing to
// choose between); with a second one, it does.
func TestPrefixRouteOnlyWhenThereIsAChoice(t *testing.T) {
	t.Parallel()
	e := startEdge(t, testConfig())
	req := contract.Request{Model: "m", Operation: contract.OperationChat, Body: agentBody(t)}
	e.connect(t, hello("n1", prov("p", nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL, 1, "m")))
	if r := e.svc.routeOf(req); r.blocks != nil {
		t.Fatalf("one provider: %d blocks computed", len(r.blocks))
	}
	e.connect(t, hello("n2", prov("p", nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL, 1, "m:latest")))
	if r := e.svc.routeOf(req); len(r.blocks) < 1000 {
		t.Fatalf("two providers: %d blocks", len(r.blocks))
	}
}
