package media

import (
	"bytes"
	"io"
	"mime/multipart"
	"strings"
	"testing"
)

// form builds a multipart body of the fields in order, each name=value;
// a name "file" is a file part.
func form(t testing.TB, fields ...string) ([]byte, string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		var w io.Writer
		var err error
		if fields[i] == "file" {
			w, err = mw.CreateFormFile("file", "a.wav")
		} else {
			w, err = mw.CreateFormField(fields[i])
		}
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(w, fields[i+1])
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes(), mw.Boundary()
}

// relayed is what the relay sends for body, its model field set to
// served: the spool's bytes, then the rest of body.
func relayed(t testing.TB, body []byte, boundary, served string) (model string, out []byte, err error) {
	t.Helper()
	sp := &spool{dir: t.TempDir()}
	defer sp.close()
	src := bytes.NewReader(body)
	model, err = readModel(io.TeeReader(src, sp), boundary)
	if err != nil {
		return "", nil, err
	}
	at := sp.valueAt(model, boundary)
	if at < 0 {
		return model, nil, io.ErrUnexpectedEOF
	}
	out, err = io.ReadAll(relayBody(sp, at, model, served, src, boundary))
	return model, out, err
}

// TestUploadModelField: the model field is found wherever it is, the
// relayed body is the body itself for the same model and the body with
// only the field's value replaced for another; a body without one, or
// with a file part named model, is refused.
func TestUploadModelField(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("\x00\x01audio", 300_000) // over maxHeldPrefix: spooled to a file
	for _, tc := range []struct {
		name   string
		fields []string
		model  string // "" : refused
	}{
		{"model first", []string{"model", "m", "file", "abc", "language", "en"}, "m"},
		{"file first", []string{"file", "abc", "model", "m"}, "m"},
		{"file first, spooled", []string{"file", big, "response_format", "json", "model", "whisper-1"}, "whisper-1"},
		{"no model", []string{"file", "abc"}, ""},
		{"empty model", []string{"model", "", "file", "abc"}, ""},
		{"model value that also appears in the file", []string{"file", "\r\n\r\nm\r\n", "model", "m"}, "m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body, boundary := form(t, tc.fields...)
			model, out, err := relayed(t, body, boundary, "")
			if tc.model == "" {
				if err == nil {
					t.Fatalf("model %q found in a body that has none", model)
				}
				return
			}
			if err != nil || model != tc.model {
				t.Fatalf("model %q, err %v; want %q", model, err, tc.model)
			}
			if _, out, err = relayed(t, body, boundary, tc.model); err != nil || !bytes.Equal(out, body) {
				t.Errorf("relayed for the same model: %d bytes, err %v; want the body's %d bytes", len(out), err, len(body))
			}
			// The field's value is the last such run before the spool's
			// end: the model field's, not the file's look-alike.
			i := bytes.LastIndex(body, []byte("\r\n\r\n"+tc.model+"\r\n--"+boundary))
			want := append(append(append([]byte{}, body[:i+4]...), "served-name"...), body[i+4+len(tc.model):]...)
			if _, out, err = relayed(t, body, boundary, "served-name"); err != nil || !bytes.Equal(out, want) {
				t.Errorf("relayed for another model: %q..., err %v", out[:min(len(out), 200)], err)
			}
		})
	}
}

// FuzzUploadModel: for any body, readModel either fails or finds a model
// whose value sits in the spool where valueAt says, and the relay of the
// same model is the body unchanged.
func FuzzUploadModel(f *testing.F) {
	body, boundary := form(f, "model", "m", "file", "abc")
	f.Add(body, boundary)
	body, boundary = form(f, "file", "x\r\n--y", "model", "whisper")
	f.Add(body, boundary)
	f.Add([]byte("--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--\r\n"), "b")
	f.Fuzz(func(t *testing.T, body []byte, boundary string) {
		if boundary == "" || len(boundary) > 70 {
			return
		}
		sp := &spool{dir: t.TempDir()}
		defer sp.close()
		src := bytes.NewReader(body)
		model, err := readModel(io.TeeReader(src, sp), boundary)
		if err != nil {
			return
		}
		if model == "" || len(model) > maxModelField {
			t.Fatalf("model %q accepted", model)
		}
		at := sp.valueAt(model, boundary)
		if at < 0 {
			return
		}
		if got := body[at : at+int64(len(model))]; string(got) != model {
			t.Fatalf("valueAt %d holds %q, not the model %q", at, got, model)
		}
		out, err := io.ReadAll(io.MultiReader(sp.reader(at, model, model), src))
		if err != nil || !bytes.Equal(out, body) {
			t.Fatalf("relay of the same model changed the body: err %v", err)
		}
	})
}
