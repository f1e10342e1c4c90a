package jsonscan

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"testing"
)

// FuzzDecode: a string String accepts decodes, through Decode, to what
// encoding/json decodes it to (escapes, surrogate pairs, lone surrogates
// and invalid UTF-8 as U+FFFD), and String accepts exactly the strings
// json.Valid accepts.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`""`, `"abc"`, `"a\"b\\c\/d\b\f\n\r\t"`, `"\u00e9\u2028"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ud83dx"`,
		`"\ude00\ud83d"`, `"\ud83d\u0041"`, `"\ud83d\ud83d\ude00"`, "\"\xff\xfe\"", "\"é\xffa\"", "\"\x01\"",
		`"\x"`, `"\u12"`, `"abc`, `"a\"`, "\"caf\xc3\"", "\"\xed\xa0\x80\"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, quoted []byte) {
		if len(quoted) < 2 || quoted[0] != '"' || quoted[len(quoted)-1] != '"' {
			return
		}
		end, _ := String(quoted, 0)
		if valid := json.Valid(quoted); (end == len(quoted)) != valid {
			t.Fatalf("String(%q) ends at %d of %d; json.Valid %v", quoted, end, len(quoted), valid)
		}
		if end != len(quoted) {
			return
		}
		var want string
		if err := json.Unmarshal(quoted, &want); err != nil {
			t.Fatal(err)
		}
		if got := AppendString(nil, quoted); !bytes.Equal(got, []byte(want)) {
			t.Fatalf("Decode(%q) = %q, encoding/json %q", quoted, got, want)
		}
	})
}

// BenchmarkDecode measures decoding a 4 KiB string of source code (tabs,
// newlines and quotes escaped) piece by piece.
func BenchmarkDecode(b *testing.B) {
	src := bytes.Repeat([]byte("\tif err := f(\"x\", 1); err != nil {\n\t\treturn err // é\n\t}\n"), 64)
	quoted, _ := json.Marshal(string(src))
	b.SetBytes(int64(len(quoted)))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		Decode(quoted, func(p []byte) { n += len(p) })
	}
}

// FuzzMembersFunc: MembersFunc whose value reads each value with Value
// walks an object as Members does (the same end, members and spans), and
// takes exactly the objects json.Valid takes.
func FuzzMembersFunc(f *testing.F) {
	for _, s := range []string{`{}`, ` { "a" : [1, {"b":null}] , "c":"d" } `, `{"a":1,}`, `{"a" 1}`, `{"a":tru}`, `{"\u0061":"x"}`, `{"a":1}}`, `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		i := SkipSpace(body, 0)
		var spans, funcSpans []int
		end, n := Members(body, i, 1, func(_ []byte, _ int, vstart, vend int) { spans = append(spans, vstart, vend) })
		fend, fn := MembersFunc(body, i, 1, func(_ []byte, _ int, vstart int) int {
			vend := Value(body, vstart, 1)
			funcSpans = append(funcSpans, vstart, vend)
			return vend
		})
		if end != fend || n != fn || (end >= 0 && !slices.Equal(spans, funcSpans)) {
			t.Fatalf("%q: Members = %d, %d, %v; MembersFunc = %d, %d, %v", body, end, n, spans, fend, fn, funcSpans)
		}
		if valid := fend >= 0 && SkipSpace(body, fend) == len(body); valid != (json.Valid(body) && i < len(body) && body[i] == '{') {
			t.Fatalf("%q: MembersFunc takes it: %v; json.Valid %v", body, valid, json.Valid(body))
		}
	})
}

// TestPlain8: eight bytes are plain at once exactly when each one is.
func TestPlain8(t *testing.T) {
	for c := range 256 {
		for pos := range 8 {
			b := []byte("abcdefgh")
			b[pos] = byte(c)
			want := true
			for _, x := range b {
				want = want && plain[x]
			}
			if got := plain8(binary.LittleEndian.Uint64(b)); got != want {
				t.Fatalf("plain8(%q) = %v, want %v", b, got, want)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1 << 20 {
		x := r.Uint64()
		if r.IntN(2) == 0 {
			x &^= hi // ASCII only, so that plain runs are common
		}
		b := binary.LittleEndian.AppendUint64(nil, x)
		want := true
		for _, c := range b {
			want = want && plain[c]
		}
		if got := plain8(x); got != want {
			t.Fatalf("plain8(%q) = %v, want %v", b, got, want)
		}
	}
}
