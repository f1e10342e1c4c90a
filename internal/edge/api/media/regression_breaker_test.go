package media

import (
	"bytes"
	"io"
	"mime/multipart"
	"testing"
)

// TestRegression_UploadModelFieldRepeated: a transcription body with a
// second model field after the file is routed (and checked against the
// key's model list) by its first, while the provider's form parser
// (Starlette's, as vLLM and faster-whisper servers use) takes the last:
// a key allowed only "m" runs "other". The relayed body must carry no
// model field but the served one, or the body must be refused.
func TestRegression_UploadModelFieldRepeated(t *testing.T) {
	t.Parallel()
	body, boundary := form(t, "model", "m", "file", "abc", "model", "other")
	model, out, err := relayed(t, body, boundary, "served")
	if err != nil {
		return // refused: fine
	}
	if model != "m" {
		t.Fatalf("routed by model %q", model)
	}
	mr := multipart.NewReader(bytes.NewReader(out), boundary)
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
}
