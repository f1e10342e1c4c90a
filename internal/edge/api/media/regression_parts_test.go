package media

import (
	"bytes"
	"io"
	"mime/multipart"
	"runtime"
	"strings"
	"testing"
)

// TestRegression_UploadModelFieldRepeatedPastTheHeaderScan: a second part
// named model was relayed to the provider when oneModel did not see its
// headers: headers over
// maxPartHeader (16 KiB, a padding header; Go's multipart reader takes
// up to 10 MiB of them), or headers ended by a bare LF blank line
// (textproto reads bare LF lines) in the body's last part. A provider's
// form parser then sees two model fields, the case oneModel refuses.
func TestRegression_UploadModelFieldRepeatedPastTheHeaderScan(t *testing.T) {
	t.Parallel()
	const b = "XXbound"
	head := "--" + b + "\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n" +
		"--" + b + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nabc\r\n"
	for _, tc := range []struct{ name, second string }{
		{"headers over 16 KiB, 200 KiB", "--" + b + "\r\nX-Pad: " + strings.Repeat("a", 200<<10) + "\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nother\r\n--" + b + "--\r\n"},
		{"headers ended by a bare LF", "--" + b + "\r\nContent-Disposition: form-data; name=\"model\"\n\nother\r\n--" + b + "--\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(head + tc.second)
			model, out, err := relayed(t, body, b, "served")
			if err != nil {
				t.Logf("refused: %v", err)
				return
			}
			if model != "m" {
				t.Fatalf("routed by model %q", model)
			}
			mr := multipart.NewReader(bytes.NewReader(out), b)
			for {
				p, err := mr.NextPart()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("relayed body: %v", err)
				}
				if p.FormName() != "model" {
					continue
				}
				v, _ := io.ReadAll(p)
				if string(v) != "served" {
					t.Errorf("the provider receives a model field %q beside the routed one (%q, served as %q)", v, model, "served")
				}
			}
		})
	}
}

// TestRegression_UploadManyPartsCostPerPart: oneModel parsed every
// relayed part's headers with a new
// textproto and bufio reader (a 4 KiB buffer each), so a body of tiny
// parts after the model field costs the edge ~15x the CPU of a file of
// the same size (21.6 MB: 2.16 s CPU against 0.14 s on a live edge; the
// default max_upload_bytes, 1 GiB, is ~100 s of CPU per request). The
// bound here: fewer than 4 allocations per relayed part.
func TestRegression_UploadManyPartsCostPerPart(t *testing.T) {
	const b = "XXbound"
	const parts = 2000
	var body strings.Builder
	body.WriteString("--" + b + "\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n")
	for range parts {
		body.WriteString("--" + b + "\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\ny\r\n")
	}
	body.WriteString("--" + b + "--\r\n")
	src := []byte(body.String())
	buf := make([]byte, 32<<10)
	allocs := testing.AllocsPerRun(5, func() {
		o := &oneModel{r: bytes.NewReader(src), delim: []byte("\r\n--" + b), pending: make([]byte, 0, 64<<10)}
		o.pending = append(o.pending, "\r\n"...)
		for {
			if _, err := o.Read(buf); err != nil {
				break
			}
		}
	})
	if per := allocs / parts; per >= 4 {
		t.Errorf("%.1f allocations per relayed part (%v for %d parts)", per, allocs, parts)
	}
}

// TestRegression_UploadHugePartHeaderHeldInMemory: readModel parsed part
// headers with Go's multipart
// reader, which takes up to 10 MiB of headers per part in memory, so a
// part with a 9 MiB header before the model field costs the edge ~23 MB
// of heap per request (8 such uploads at once: RSS 40 MB to 224 MB on a
// live edge), against the upload design's bound of maxHeldPrefix (1 MiB)
// held in memory. The bound here: readModel allocates less than 4 MiB.
func TestRegression_UploadHugePartHeaderHeldInMemory(t *testing.T) {
	const b = "XXbound"
	body := "--" + b + "\r\nContent-Disposition: form-data; name=\"x\"\r\nX-Pad: " + strings.Repeat("a", 9<<20) +
		"\r\n\r\ny\r\n--" + b + "\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--" + b + "--\r\n"
	sp := &spool{dir: t.TempDir()}
	defer sp.close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := readModel(io.TeeReader(strings.NewReader(body), sp), b)
	runtime.ReadMemStats(&after)
	if err != nil {
		return // refused: fine
	}
	if n := after.TotalAlloc - before.TotalAlloc; n >= 4<<20 {
		t.Errorf("readModel allocated %d MiB for a body with a 9 MiB part header", n>>20)
	}
}
