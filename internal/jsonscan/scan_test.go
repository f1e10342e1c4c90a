package jsonscan

import (
	"bytes"
	"encoding/json"
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
