package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/batch"
	"iop/internal/testenv"
)

// gatedExecutor answers every line 200 once let is called; until then
// lines wait (a batch stays in progress).
type gatedExecutor struct {
	once sync.Once
	open chan struct{}
}

func newGatedExecutor() *gatedExecutor { return &gatedExecutor{open: make(chan struct{})} }

func (g *gatedExecutor) let() { g.once.Do(func() { close(g.open) }) }

func (g *gatedExecutor) Execute(ctx context.Context, _, path string, _ []byte) (batch.Response, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return batch.Response{}, ctx.Err()
	}
	body := `{"object":"chat.completion","choices":[]}`
	if path == "/v1/messages" {
		body = `{"type":"message","role":"assistant","content":[]}`
	}
	return batch.Response{Status: 200, Body: []byte(body)}, nil
}

// apiRig is the batch routes over a service on an in-memory SQLite.
type apiRig struct {
	t      *testing.T
	svc    *batch.Service
	routes http.Handler
	exec   *gatedExecutor
}

func newAPIRig(t *testing.T) *apiRig {
	t.Helper()
	store, err := batch.OpenSQLite(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	s, err := batch.New(batch.Config{Store: store, Dir: t.TempDir(), RetryDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	exec := newGatedExecutor()
	t.Cleanup(exec.let)
	if err := s.Start(context.Background(), exec); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	for path, rt := range Routes(s, nil) {
		mux.HandleFunc(path, rt.Serve)
	}
	return &apiRig{t: t, svc: s, routes: mux, exec: exec}
}

// do serves method path with body (JSON unless contentType says) and
// returns the status and the decoded answer.
func (r *apiRig) do(method, path, contentType string, body io.Reader) (int, map[string]any) {
	r.t.Helper()
	req := httptest.NewRequest(method, path, body)
	if contentType == "" {
		contentType = "application/json"
	}
	req.Header.Set("Content-Type", contentType)
	rec := httptest.NewRecorder()
	r.routes.ServeHTTP(rec, req)
	var out map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		r.t.Fatalf("%s %s: %d, not a JSON object: %q", method, path, rec.Code, rec.Body)
	}
	return rec.Code, out
}

func (r *apiRig) upload(content string) string {
	r.t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	io.WriteString(fw, content)
	mw.WriteField("purpose", "batch")
	mw.Close()
	status, f := r.do(http.MethodPost, filesPath, mw.FormDataContentType(), &buf)
	if status != http.StatusOK {
		r.t.Fatalf("upload: %d %v", status, f)
	}
	return f["id"].(string)
}

// openAIError checks an OpenAI error answer: status, code and param (""
// for null).
func openAIError(t *testing.T, what string, status int, out map[string]any, wantStatus int, code, param string) {
	t.Helper()
	e, _ := out["error"].(map[string]any)
	gotParam, _ := e["param"].(string)
	if status != wantStatus || e == nil || e["code"] != code || gotParam != param || e["type"] != "invalid_request_error" {
		t.Errorf("%s: %d %v; want %d, code %s, param %q", what, status, out, wantStatus, code, param)
	}
}

// TestRegression_BatchCreateErrorsNameTheParameter: POST /v1/batches
// without input_file_id answered 404 "not found: no file " (an empty id
// looked up); a field of the wrong JSON type answered "the body is not a
// valid JSON object"; metadata keys and values of any length were kept
// (a 2 MB value came back on every list). Each now gets OpenAI's 400
// naming its parameter (a wrong type: invalid_type, as OpenAI's API
// answers one).
func TestRegression_BatchCreateErrorsNameTheParameter(t *testing.T) {
	t.Parallel()
	r := newAPIRig(t)
	file := r.upload(`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}` + "\n")
	create := func(fields string) (int, map[string]any) {
		return r.do(http.MethodPost, batchesPath, "", strings.NewReader("{"+fields+"}"))
	}
	ok := fmt.Sprintf(`"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"`, file)
	for _, c := range []struct {
		name, body, code, param string
	}{
		{"no input_file_id", `"endpoint":"/v1/chat/completions","completion_window":"24h"`, "missing_required_parameter", "input_file_id"},
		{"no endpoint", fmt.Sprintf(`"input_file_id":%q,"completion_window":"24h"`, file), "missing_required_parameter", "endpoint"},
		{"no completion_window", fmt.Sprintf(`"input_file_id":%q,"endpoint":"/v1/chat/completions"`, file), "missing_required_parameter", "completion_window"},
		{"input_file_id a number", `"input_file_id":123,"endpoint":"/v1/chat/completions","completion_window":"24h"`, "invalid_type", "input_file_id"},
		{"metadata a string", ok + `,"metadata":"x"`, "invalid_type", "metadata"},
		{"metadata value a number", ok + `,"metadata":{"k":1}`, "invalid_type", "metadata"},
		{"metadata value of 513", ok + `,"metadata":{"k":"` + strings.Repeat("é", 513) + `"}`, "invalid_value", "metadata.k"},
		{"metadata key of 65", ok + `,"metadata":{"` + strings.Repeat("k", 65) + `":"v"}`, "invalid_value", "metadata"},
	} {
		status, out := create(c.body)
		openAIError(t, c.name, status, out, http.StatusBadRequest, c.code, c.param)
	}
	_, out := create(`"input_file_id":123,"endpoint":"/v1/chat/completions","completion_window":"24h"`)
	if e, _ := out["error"].(map[string]any); e["message"] != "Invalid type for 'input_file_id': expected a string, but got a number instead." {
		t.Errorf("a number for input_file_id: message %q, in OpenAI's words", e["message"])
	}
	// The bounds themselves are allowed: 16 pairs, keys of 64, values of 512.
	meta := map[string]string{}
	for i := range 16 {
		meta[fmt.Sprintf("%064d", i)] = strings.Repeat("é", 512)
	}
	raw, _ := json.Marshal(meta)
	if status, out := create(ok + `,"metadata":` + string(raw)); status != http.StatusOK || out["status"] != "validating" {
		t.Fatalf("metadata at the bounds: %d %v", status, out)
	}
}

// TestRegression_BatchFileLineErrors: an input file that starts with a
// UTF-8 byte order mark failed as "not parseable as valid JSON" at line
// 1, as did a line whose custom_id is a number; the mark is now skipped,
// and the number named.
func TestRegression_BatchFileLineErrors(t *testing.T) {
	t.Parallel()
	r := newAPIRig(t)
	r.exec.let()
	run := func(content string) map[string]any {
		t.Helper()
		status, b := r.do(http.MethodPost, batchesPath, "", strings.NewReader(fmt.Sprintf(
			`{"input_file_id":%q,"endpoint":"/v1/chat/completions","completion_window":"24h"}`, r.upload(content))))
		if status != http.StatusOK {
			t.Fatalf("create: %d %v", status, b)
		}
		testenv.Eventually(t, "the batch to end", func() bool {
			_, b = r.do(http.MethodGet, batchesPath+"/"+b["id"].(string), "", nil)
			return b["status"] == "completed" || b["status"] == "failed"
		})
		return b
	}
	line := `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}`
	if b := run("\xef\xbb\xbf" + line + "\n"); b["status"] != "completed" {
		t.Errorf("a file with a byte order mark: %v; want completed", b)
	}
	b := run(`{"custom_id":1,"method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}` + "\n")
	errs, _ := b["errors"].(map[string]any)
	data, _ := errs["data"].([]any)
	if b["status"] != "failed" || len(data) != 1 {
		t.Fatalf("a numeric custom_id: %v; want failed with one error", b)
	}
	if e := data[0].(map[string]any); e["code"] != "invalid_value" || e["param"] != "custom_id" || e["line"] != float64(1) ||
		!strings.Contains(e["message"].(string), "must be a string") {
		t.Errorf("a numeric custom_id: error %v", e)
	}
	// Valid lines before a bad one are not counted: a failed batch holds
	// no request (it reported the lines stored before the error: over
	// 1,000 of them, validation's first chunk).
	var many strings.Builder
	for i := range 1200 {
		fmt.Fprintf(&many, `{"custom_id":"l%d","method":"POST","url":"/v1/chat/completions","body":{"model":"m"}}`+"\n", i)
	}
	b = run(many.String() + `{"custom_id":"bad"}` + "\n")
	if counts, _ := b["request_counts"].(map[string]any); b["status"] != "failed" || counts["total"] != float64(0) {
		t.Errorf("a bad line after 1,200 good ones: %v; want failed with total 0", b)
	}
}

// anthropicError checks an Anthropic error answer: status and error type.
func anthropicError(t *testing.T, what string, status int, out map[string]any, wantStatus int, typ string) {
	t.Helper()
	e, _ := out["error"].(map[string]any)
	if status != wantStatus || out["type"] != "error" || e == nil || e["type"] != typ || e["message"] == "" {
		t.Errorf("%s: %d %v; want %d %s in Anthropic's shape", what, status, out, wantStatus, typ)
	}
}

// TestMessageBatchDeleteAndCursors: DELETE /v1/messages/batches/{id}
// (Anthropic's "Delete a Message Batch") deletes an ended batch and its
// results, and refuses one still processing (cancel first); cancelling
// an ended batch is a 400 in Anthropic's shape (its error table has no
// 409), as is a method a path does not take; before_id pages towards
// newer batches as after_id does towards older.
func TestMessageBatchDeleteAndCursors(t *testing.T) {
	t.Parallel()
	r := newAPIRig(t)
	create := func() string {
		status, b := r.do(http.MethodPost, messagesPath, "", strings.NewReader(
			`{"requests":[{"custom_id":"a","params":{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}}]}`))
		if status != http.StatusOK {
			t.Fatalf("create: %d %v", status, b)
		}
		return b["id"].(string)
	}
	var ids []string // oldest first
	for range 5 {
		ids = append(ids, create())
	}
	status, out := r.do(http.MethodDelete, messagesPath+"/"+ids[0], "", nil)
	anthropicError(t, "delete in progress", status, out, http.StatusBadRequest, "invalid_request_error")

	list := func(query string) []string {
		t.Helper()
		status, out := r.do(http.MethodGet, messagesPath+"?"+query, "", nil)
		if status != http.StatusOK {
			t.Fatalf("list %s: %d %v", query, status, out)
		}
		var got []string
		for _, b := range out["data"].([]any) {
			got = append(got, b.(map[string]any)["id"].(string))
		}
		return got
	}
	if got, want := list("before_id="+ids[1]+"&limit=2"), []string{ids[3], ids[2]}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("before_id %s limit 2: %v, want %v", ids[1], got, want)
	}
	if got, want := list("after_id="+ids[3]+"&limit=2"), []string{ids[2], ids[1]}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after_id %s limit 2: %v, want %v", ids[3], got, want)
	}
	for _, cursor := range []string{"after_id", "before_id"} {
		status, out := r.do(http.MethodGet, messagesPath+"?"+cursor+"=msgbatch_unknown", "", nil)
		anthropicError(t, "an unknown "+cursor, status, out, http.StatusNotFound, "not_found_error")
	}

	r.exec.let()
	testenv.Eventually(t, "the batches to end", func() bool {
		_, b := r.do(http.MethodGet, messagesPath+"/"+ids[0], "", nil)
		return b["processing_status"] == "ended"
	})
	status, out = r.do(http.MethodPost, messagesPath+"/"+ids[0]+"/cancel", "", nil)
	anthropicError(t, "cancel ended", status, out, http.StatusBadRequest, "invalid_request_error")
	status, out = r.do(http.MethodPut, messagesPath+"/"+ids[0], "", nil)
	anthropicError(t, "PUT", status, out, http.StatusMethodNotAllowed, "invalid_request_error")

	if status, out = r.do(http.MethodDelete, messagesPath+"/"+ids[0], "", nil); status != http.StatusOK ||
		out["id"] != ids[0] || out["type"] != "message_batch_deleted" {
		t.Fatalf("delete ended: %d %v", status, out)
	}
	for _, path := range []string{messagesPath + "/" + ids[0], messagesPath + "/" + ids[0] + "/results"} {
		status, out = r.do(http.MethodGet, path, "", nil)
		anthropicError(t, "GET "+path+" after delete", status, out, http.StatusNotFound, "not_found_error")
	}
	status, out = r.do(http.MethodDelete, messagesPath+"/"+ids[0], "", nil)
	anthropicError(t, "delete again", status, out, http.StatusNotFound, "not_found_error")
	if got := list("limit=10"); len(got) != 4 {
		t.Errorf("after one delete the list holds %v, want 4 batches", got)
	}
}

// brokenContents is a file store whose writes fail after reading what
// they are given (a full disk, a directory removed).
type brokenContents struct{}

func (brokenContents) Put(_ context.Context, _ string, r io.Reader) (int64, error) {
	n, err := io.Copy(io.Discard, r)
	if err != nil {
		return n, err
	}
	return n, errors.New("write /tmp/iop-batch-files/file-x: no space left on device")
}
func (brokenContents) Open(context.Context, string) (io.ReadCloser, error) {
	return nil, batch.ErrNotFound
}
func (brokenContents) Remove(context.Context, string) error { return nil }

// TestRegression_UploadStoreFailureIsAServerError: a file store that
// failed to write an upload was answered 400 invalid_value "the multipart
// form could not be read", as if the client's body were broken, and
// nothing was logged; it is a 500 now (logged), while a cut multipart
// body stays a 400.
func TestRegression_UploadStoreFailureIsAServerError(t *testing.T) {
	t.Parallel()
	store, err := batch.OpenSQLite(":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	s, err := batch.New(batch.Config{Store: store, Contents: brokenContents{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var logs bytes.Buffer
	mux := http.NewServeMux()
	for path, rt := range Routes(s, slog.New(slog.NewTextHandler(&logs, nil))) {
		mux.HandleFunc(path, rt.Serve)
	}
	post := func(body, contentType string) (int, map[string]any) {
		req := httptest.NewRequest(http.MethodPost, filesPath, strings.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		var out map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &out)
		return rec.Code, out
	}
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	io.WriteString(fw, `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{}}`+"\n")
	mw.Close()
	whole := buf.String()
	status, out := post(whole, mw.FormDataContentType())
	if e, _ := out["error"].(map[string]any); status != http.StatusInternalServerError || e["type"] != "server_error" {
		t.Errorf("a store that failed: %d %v; want 500 server_error", status, out)
	}
	if !strings.Contains(logs.String(), "no space left on device") {
		t.Errorf("the store's failure is not logged: %q", logs.String())
	}
	cut := whole[:strings.Index(whole, `"custom_id"`)+5] // the file part cut short, no closing boundary
	status, out = post(cut, mw.FormDataContentType())
	openAIError(t, "a cut multipart body", status, out, http.StatusBadRequest, "invalid_value", "")
}
