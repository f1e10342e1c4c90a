package edge

import (
	"encoding/binary"
	"hash/maphash"

	"iop/internal/edge/contract"
	"iop/internal/jsonscan"
)

// scanPromptBlocks is promptBlocks read in place: one pass over body with
// jsonscan, the prompt's text hashed block by block as it is rendered,
// without decoding the document or copying the text whole. ok is false
// for a body whose reading only encoding/json settles for certain: a key
// of interest spelled in another case, a key with an escape or a
// non-ASCII byte, a key of interest given twice; promptBlocks then
// decodes it (decodePromptBlocks). The result otherwise equals
// decodePromptBlocks(op, body) (TestPromptBlocksScanEqualsDecode).
func scanPromptBlocks(op contract.Operation, body []byte) (blocks []uint64, ok bool) {
	var p promptScan
	p.body = body
	switch op {
	case contract.OperationChat:
		p.want = chatKeys
	case contract.OperationCompletion:
		p.want = completionKeys
	default:
		return nil, true
	}
	switch p.top() {
	case scanFallback:
		return nil, false
	case scanInvalid:
		return nil, true
	}
	h := blockHasher{out: make([]uint64, 0, len(body)/prefixBlockChars+1)}
	if op == contract.OperationCompletion {
		p.writeText(&h, p.prompt)
		return h.blocks(), true
	}
	h.write(body[p.tools.start:p.tools.end])
	for _, m := range p.msgs {
		h.writeString("\x00")
		if m.role.end > 0 {
			p.writeString(&h, m.role)
		}
		h.writeString("\x00")
		p.writeText(&h, m.content)
		h.write(body[m.toolCalls.start:m.toolCalls.end])
		if m.toolCallID.end > 0 {
			p.writeString(&h, m.toolCallID)
		}
	}
	return h.blocks(), true
}

// textSpan is the span of one JSON value in the body; a zero span is an
// absent value.
type textSpan struct{ start, end int }

// msgSpans is what the prompt takes of one message: role and tool_call_id
// (strings; a zero span when absent or null), content and tool_calls (raw
// values).
type msgSpans struct {
	role, content, toolCalls, toolCallID textSpan
}

// The top-level keys a prompt is read from.
var (
	chatKeys       = []string{"tools", "messages"}
	completionKeys = []string{"prompt"}
	messageKeys    = []string{"role", "content", "tool_calls", "tool_call_id"}
)

// Outcomes of a scan.
type scanOutcome int

const (
	scanDone     scanOutcome = iota // read: the spans are set
	scanInvalid                     // not valid JSON, or a type encoding/json refuses: no blocks
	scanFallback                    // for encoding/json to read (scanPromptBlocks)
)

// promptScan is one reading of a body: the spans of its prompt's parts.
type promptScan struct {
	body   []byte
	want   []string
	tools  textSpan
	prompt textSpan
	msgs   []msgSpans
}

// top reads the top-level object, member by member; the messages array is
// read as it is walked, so every byte is scanned once.
func (p *promptScan) top() scanOutcome {
	body := p.body
	i := jsonscan.SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		// Not an object: encoding/json refuses it (or, for null, decodes
		// nothing); either way there are no blocks.
		return scanInvalid
	}
	var seen [2]bool
	out := scanDone
	i = jsonscan.SkipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return p.end(i+1, out)
	}
	for {
		if i >= len(body) || body[i] != '"' {
			return scanInvalid
		}
		kend, kflags := jsonscan.String(body, i)
		if kend < 0 {
			return scanInvalid
		}
		key := body[i+1 : kend-1]
		if i = jsonscan.SkipSpace(body, kend); i >= len(body) || body[i] != ':' {
			return scanInvalid
		}
		vstart := jsonscan.SkipSpace(body, i+1)
		k := keyIndex(key, kflags, p.want)
		var vend int
		switch {
		case k == keyFallback:
			out = scanFallback
			vend = jsonscan.Value(body, vstart, 1)
		case k >= 0 && seen[k]:
			out = scanFallback
			vend = jsonscan.Value(body, vstart, 1)
		case k >= 0 && p.want[k] == "messages":
			seen[k] = true
			var o scanOutcome
			vend, o = p.messages(vstart)
			out = max(out, o)
		default:
			if k >= 0 {
				seen[k] = true
			}
			vend = jsonscan.Value(body, vstart, 1)
			if k >= 0 && vend >= 0 {
				switch p.want[k] {
				case "tools":
					p.tools = textSpan{vstart, vend}
				case "prompt":
					p.prompt = textSpan{vstart, vend}
				}
			}
		}
		if vend < 0 {
			return scanInvalid
		}
		if i = jsonscan.SkipSpace(body, vend); i >= len(body) {
			return scanInvalid
		}
		switch body[i] {
		case ',':
			i = jsonscan.SkipSpace(body, i+1)
		case '}':
			return p.end(i+1, out)
		default:
			return scanInvalid
		}
	}
}

// end is out for an object that ends just before i, when nothing but
// white space follows it.
func (p *promptScan) end(i int, out scanOutcome) scanOutcome {
	if jsonscan.SkipSpace(p.body, i) != len(p.body) {
		return scanInvalid
	}
	return out
}

// keyFallback is keyIndex's answer for a key only encoding/json can match.
const keyFallback = -2

// keyIndex is the index in want of the object key key (without quotes,
// with jsonscan.String's flags), -1 for a key that is none of them, or
// keyFallback for one encoding/json might match to one of them although
// it is not spelled so: it matches keys case-insensitively, also under
// Unicode folding and after escapes.
func keyIndex(key []byte, flags int, want []string) int {
	if flags != 0 {
		return keyFallback
	}
	for k, w := range want {
		if string(key) == w {
			return k
		}
	}
	for _, w := range want {
		if equalFoldASCII(key, w) {
			return keyFallback
		}
	}
	return -1
}

// equalFoldASCII reports whether the ASCII key equals w but for the case
// of its letters.
func equalFoldASCII(key []byte, w string) bool {
	if len(key) != len(w) {
		return false
	}
	for i := range key {
		if key[i]|0x20 != w[i]|0x20 {
			return false
		}
	}
	return true
}

// messages reads the messages array, or null, at body[i]; end is the
// index just past it, -1 when it is not valid JSON.
func (p *promptScan) messages(i int) (end int, out scanOutcome) {
	body := p.body
	if i >= len(body) {
		return -1, out
	}
	if body[i] != '[' {
		end = jsonscan.Value(body, i, 1)
		if end >= 0 && body[i] != 'n' {
			out = scanInvalid // not an array: encoding/json refuses it
		}
		return end, out
	}
	// The array is nested 2 deep, its elements' members 3 deep.
	i = jsonscan.SkipSpace(body, i+1)
	if i < len(body) && body[i] == ']' {
		return i + 1, out
	}
	for {
		var vend int
		switch {
		case i < len(body) && body[i] == '{':
			var o scanOutcome
			vend, o = p.message(i)
			out = max(out, o)
		default:
			vend = jsonscan.Value(body, i, 2)
			if vend >= 0 && body[i] != 'n' {
				out = scanInvalid // a message that is not an object
			}
			p.msgs = append(p.msgs, msgSpans{})
		}
		if vend < 0 {
			return -1, out
		}
		if i = jsonscan.SkipSpace(body, vend); i >= len(body) {
			return -1, out
		}
		switch body[i] {
		case ',':
			i = jsonscan.SkipSpace(body, i+1)
		case ']':
			return i + 1, out
		default:
			return -1, out
		}
	}
}

// message reads the message object at body[i].
func (p *promptScan) message(i int) (end int, out scanOutcome) {
	var m msgSpans
	var seen [4]bool
	end, _ = jsonscan.Members(p.body, i, 3, func(key []byte, kflags int, vstart, vend int) {
		k := keyIndex(key[1:len(key)-1], kflags, messageKeys)
		switch {
		case k == -1:
			return
		case k == keyFallback || seen[k]:
			out = max(out, scanFallback)
			return
		}
		seen[k] = true
		v := textSpan{vstart, vend}
		switch k {
		case 0, 3: // role, tool_call_id: a string or null
			switch p.body[vstart] {
			case '"':
			case 'n':
				v = textSpan{}
			default:
				out = scanInvalid
			}
		}
		switch k {
		case 0:
			m.role = v
		case 1:
			m.content = v
		case 2:
			m.toolCalls = v
		case 3:
			m.toolCallID = v
		}
	})
	p.msgs = append(p.msgs, m)
	return end, out
}

// writeString writes the JSON string at v, decoded, to h.
func (p *promptScan) writeString(h *blockHasher, v textSpan) {
	jsonscan.Decode(p.body[v.start:v.end], h.write)
}

// writeText writes v as appendJSONText renders it: a string's value, any
// other value's raw JSON.
func (p *promptScan) writeText(h *blockHasher, v textSpan) {
	if v.end > v.start && p.body[v.start] == '"' {
		p.writeString(h, v)
		return
	}
	h.write(p.body[v.start:v.end])
}

// blockHasher computes chainHashes of the text written to it, block by
// block as it comes: buf holds the previous block's hash, then the block
// being filled.
type blockHasher struct {
	buf [8 + prefixBlockChars]byte
	n   int // bytes of the block being filled
	out []uint64
}

func (h *blockHasher) write(p []byte) {
	for len(p) > 0 {
		c := copy(h.buf[8+h.n:], p)
		h.n += c
		p = p[c:]
		if h.n == prefixBlockChars {
			sum := maphash.Bytes(prefixSeed, h.buf[:])
			h.out = append(h.out, sum)
			binary.LittleEndian.PutUint64(h.buf[:8], sum)
			h.n = 0
		}
	}
}

func (h *blockHasher) writeString(s string) {
	for len(s) > 0 {
		c := copy(h.buf[8+h.n:], s)
		h.n += c
		s = s[c:]
		if h.n == prefixBlockChars {
			sum := maphash.Bytes(prefixSeed, h.buf[:])
			h.out = append(h.out, sum)
			binary.LittleEndian.PutUint64(h.buf[:8], sum)
			h.n = 0
		}
	}
}

// blocks is the hashes of the full blocks written, nil when there are none.
func (h *blockHasher) blocks() []uint64 {
	if len(h.out) == 0 {
		return nil
	}
	return h.out
}
