package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/internal/auth"
	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/ollamatest"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/status"
	"iop/internal/testenv"
)

// batchAPI calls an edge's files and batches APIs over HTTP, with key
// (when not "") as its bearer token.
type batchAPI struct {
	t         *testing.T
	base, key string
}

func (c batchAPI) do(method, path, contentType string, body io.Reader) (int, []byte) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.StatusCode, b
}

// upload posts content as a batch input file (the file part before the
// purpose, as the openai SDK sends files.create({file, purpose})).
func (c batchAPI) upload(content string) (int, []byte) {
	c.t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, _ := mw.CreateFormFile("file", "input.jsonl")
	_, _ = io.WriteString(fw, content)
	_ = mw.WriteField("purpose", "batch")
	_ = mw.Close()
	return c.do(http.MethodPost, "/v1/files", mw.FormDataContentType(), &buf)
}

// object decodes a 200 answer of method path into a map, failing
// otherwise.
func (c batchAPI) object(method, path, body string) map[string]any {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	status, b := c.do(method, path, "application/json", rd)
	var out map[string]any
	if status != http.StatusOK || json.Unmarshal(b, &out) != nil {
		c.t.Fatalf("%s %s: %d %s", method, path, status, b)
	}
	return out
}

// uploadFile uploads content and returns the file's id.
func (c batchAPI) uploadFile(content string) string {
	c.t.Helper()
	status, b := c.upload(content)
	var f struct {
		ID, Object, Purpose, Filename string
		Bytes                         int
	}
	if status != http.StatusOK || json.Unmarshal(b, &f) != nil || f.Object != "file" || f.Purpose != "batch" ||
		f.Filename != "input.jsonl" || f.Bytes != len(content) || !strings.HasPrefix(f.ID, "file-") {
		c.t.Fatalf("upload: %d %s", status, b)
	}
	return f.ID
}

// createBatch creates a batch of file id for endpoint.
func (c batchAPI) createBatch(fileID, endpoint string) string {
	c.t.Helper()
	b := c.object(http.MethodPost, "/v1/batches", fmt.Sprintf(`{"input_file_id":%q,"endpoint":%q,"completion_window":"24h","metadata":{"job":"e2e"}}`, fileID, endpoint))
	if b["object"] != "batch" || b["status"] != "validating" || b["endpoint"] != endpoint {
		c.t.Fatalf("created batch: %v", b)
	}
	return b["id"].(string)
}

// waitBatch polls batch id until its status is one of want.
func (c batchAPI) waitBatch(id string, want ...string) map[string]any {
	c.t.Helper()
	var b map[string]any
	testenv.EventuallyWithin(c.t, 2*time.Minute, "batch "+id+" to be "+strings.Join(want, " or "), func() bool {
		b = c.object(http.MethodGet, "/v1/batches/"+id, "")
		for _, w := range want {
			if b["status"] == w {
				return true
			}
		}
		return false
	})
	return b
}

// resultLines reads file id's JSONL lines, by custom_id; a custom_id seen
// twice fails the test.
func (c batchAPI) resultLines(id string) map[string]map[string]any {
	c.t.Helper()
	out := map[string]map[string]any{}
	if id == "" {
		return out
	}
	status, b := c.do(http.MethodGet, "/v1/files/"+id+"/content", "", nil)
	if status != http.StatusOK {
		c.t.Fatalf("content of %s: %d %s", id, status, b)
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		var l map[string]any
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			c.t.Fatalf("result line %q: %v", line, err)
		}
		cid, _ := l["custom_id"].(string)
		if _, dup := out[cid]; dup {
			c.t.Fatalf("custom_id %q has two result lines", cid)
		}
		out[cid] = l
	}
	return out
}

// counts is a batch's request_counts.
func counts(b map[string]any) (total, completed, failed int) {
	rc := b["request_counts"].(map[string]any)
	return int(rc["total"].(float64)), int(rc["completed"].(float64)), int(rc["failed"].(float64))
}

// chatLines are n chat-completion batch lines of model, custom ids
// prefix-0 … prefix-(n-1).
func chatLines(prefix, model string, n, maxTokens int) string {
	var sb strings.Builder
	for i := range n {
		fmt.Fprintf(&sb, `{"custom_id":"%s-%d","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"line %d"}]}}`+"\n",
			prefix, i, model, maxTokens, i)
	}
	return sb.String()
}

// batchRig is an edge in this process with a node serving model "fast"
// (an Ollama simulator, normalized path), "tunneled" (an OpenAI one,
// tunnel path) and "slow" (capacity 1, 20 tokens a second).
func batchRig(t *testing.T, cfg process.EdgeFile) batchAPI {
	t.Helper()
	_, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"fast", "slow"}, Seed: 3})
	_, openaiURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"tunneled"}, Seed: 3})
	_, slowURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"slow"}, TokensPerSecond: 20, Seed: 3})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := harness.Edge(t, ctx, cfg)
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "ollama", Type: node.TypeOllama, BaseURL: ollamaURL, Models: []string{"fast"}, Capacity: 4, Capabilities: []string{"embeddings"}},
		{ID: "vllm", Type: "vllm", BaseURL: openaiURL + "/v1", Models: []string{"tunneled"}, Capacity: 4},
		{ID: "slow", Type: node.TypeOllama, BaseURL: slowURL, Models: []string{"slow"}, Capacity: 1},
	}})
	return batchAPI{t: t, base: "http://" + e.HTTPAddr}
}

// TestBatchRunsEveryLineOnce: a batch of chat completions over both
// execution paths, with one line of an unknown model, goes validating →
// in_progress → completed; its output file has one 200 line per good
// custom_id and its error file the 404 of the bad one; the files API
// lists, reads and deletes the files.
func TestBatchRunsEveryLineOnce(t *testing.T) {
	harness.Parallel(t)
	c := batchRig(t, harness.EdgeConfig(nil))
	input := chatLines("n", "fast", 6, 8) + chatLines("t", "tunneled", 6, 8) +
		`{"custom_id":"bad","method":"POST","url":"/v1/chat/completions","body":{"model":"nope","messages":[{"role":"user","content":"x"}]}}` + "\n"
	fileID := c.uploadFile(input)
	if status, b := c.do(http.MethodGet, "/v1/files/"+fileID+"/content", "", nil); status != http.StatusOK || string(b) != input {
		t.Fatalf("content: %d %q", status, b)
	}
	id := c.createBatch(fileID, "/v1/chat/completions")
	b := c.waitBatch(id, "completed", "failed", "expired", "cancelled")
	if b["status"] != "completed" || b["in_progress_at"] == nil || b["finalizing_at"] == nil || b["completed_at"] == nil {
		t.Fatalf("batch: %v", b)
	}
	if total, done, failed := counts(b); total != 13 || done != 12 || failed != 1 {
		t.Fatalf("request_counts: %v", b["request_counts"])
	}
	out := c.resultLines(b["output_file_id"].(string))
	if len(out) != 12 {
		t.Fatalf("output file: %d lines, want 12", len(out))
	}
	for cid, l := range out {
		resp := l["response"].(map[string]any)
		body := resp["body"].(map[string]any)
		if resp["status_code"] != float64(200) || body["object"] != "chat.completion" || l["error"] != nil ||
			!strings.HasPrefix(l["id"].(string), "batch_req_") || resp["request_id"] == "" {
			t.Fatalf("output line %s: %v", cid, l)
		}
	}
	errs := c.resultLines(b["error_file_id"].(string))
	if bad := errs["bad"]; len(errs) != 1 || bad["response"].(map[string]any)["status_code"] != float64(404) {
		t.Fatalf("error file: %v", errs)
	}
	if status, metrics := c.do(http.MethodGet, "/metrics", "", nil); status != http.StatusOK ||
		!strings.Contains(string(metrics), `iop_batch_lines_total{api="openai",state="done"} 12`) ||
		!strings.Contains(string(metrics), `iop_batch_lines_total{api="openai",state="failed"} 1`) {
		t.Fatalf("metrics: %d\n%s", status, metrics)
	}
	list := c.object(http.MethodGet, "/v1/batches?limit=1", "")
	if data := list["data"].([]any); len(data) != 1 || data[0].(map[string]any)["id"] != id || list["object"] != "list" {
		t.Fatalf("batches list: %v", list)
	}
	files := c.object(http.MethodGet, "/v1/files?purpose=batch", "")
	if data := files["data"].([]any); len(data) != 1 || data[0].(map[string]any)["id"] != fileID {
		t.Fatalf("files list: %v", files)
	}
	if del := c.object(http.MethodDelete, "/v1/files/"+fileID, ""); del["deleted"] != true {
		t.Fatalf("delete: %v", del)
	}
	if status, _ := c.do(http.MethodGet, "/v1/files/"+fileID, "", nil); status != http.StatusNotFound {
		t.Fatalf("deleted file: %d", status)
	}
}

// TestBatchEmbeddings runs a batch of the embeddings endpoint.
func TestBatchEmbeddings(t *testing.T) {
	harness.Parallel(t)
	c := batchRig(t, harness.EdgeConfig(nil))
	var sb strings.Builder
	for i := range 5 {
		fmt.Fprintf(&sb, `{"custom_id":"e%d","method":"POST","url":"/v1/embeddings","body":{"model":"fast","input":"text %d"}}`+"\n", i, i)
	}
	b := c.waitBatch(c.createBatch(c.uploadFile(sb.String()), "/v1/embeddings"), "completed", "failed")
	if b["output_file_id"] == nil {
		t.Fatalf("batch %v, errors %v", b, c.resultLines(b["error_file_id"].(string)))
	}
	out := c.resultLines(b["output_file_id"].(string))
	if _, done, _ := counts(b); done != 5 || len(out) != 5 {
		t.Fatalf("batch %v, %d output lines", b, len(out))
	}
	for cid, l := range out {
		if body := l["response"].(map[string]any)["body"].(map[string]any); body["object"] != "list" {
			t.Fatalf("line %s: %v", cid, l)
		}
	}
}

// TestBatchValidationNamesLines: an input file with bad lines fails
// validation, each error naming its line and code, and runs nothing.
func TestBatchValidationNamesLines(t *testing.T) {
	harness.Parallel(t)
	c := batchRig(t, harness.EdgeConfig(nil))
	input := chatLines("ok", "fast", 1, 4) +
		"{not json\n" +
		`{"method":"POST","url":"/v1/chat/completions","body":{"model":"fast"}}` + "\n" +
		`{"custom_id":"ok-0","method":"POST","url":"/v1/chat/completions","body":{"model":"fast"}}` + "\n" +
		`{"custom_id":"e","method":"POST","url":"/v1/embeddings","body":{"model":"fast"}}` + "\n"
	b := c.waitBatch(c.createBatch(c.uploadFile(input), "/v1/chat/completions"), "failed", "completed", "in_progress")
	if b["status"] != "failed" || b["failed_at"] == nil || b["output_file_id"] != nil {
		t.Fatalf("batch: %v", b)
	}
	data := b["errors"].(map[string]any)["data"].([]any)
	want := []struct {
		line int
		code string
	}{{2, "invalid_json_line"}, {3, "missing_required_parameter"}, {4, "duplicate_custom_id"}, {5, "mismatched_endpoint"}}
	if len(data) != len(want) {
		t.Fatalf("errors: %v", data)
	}
	for i, w := range want {
		e := data[i].(map[string]any)
		if e["line"] != float64(w.line) || e["code"] != w.code || e["message"] == "" {
			t.Errorf("error %d: %v, want line %d code %s", i, e, w.line, w.code)
		}
	}
	// Requests that cannot be a batch are refused at once.
	for _, body := range []string{
		`{"input_file_id":"file-nope","endpoint":"/v1/chat/completions","completion_window":"24h"}`,
		`{"input_file_id":"x","endpoint":"/v1/audio","completion_window":"24h"}`,
		`{"input_file_id":"x","endpoint":"/v1/chat/completions","completion_window":"1h"}`,
	} {
		if status, b := c.do(http.MethodPost, "/v1/batches", "application/json", strings.NewReader(body)); status != http.StatusNotFound && status != http.StatusBadRequest {
			t.Errorf("create %s: %d %s", body, status, b)
		}
	}
}

// TestBatchUploadOverTheLimit: a file over the edge's body limit is
// answered 413 and leaves no file.
func TestBatchUploadOverTheLimit(t *testing.T) {
	harness.Parallel(t)
	cfg := harness.EdgeConfig(nil)
	cfg.MaxBodyBytes = 8 << 10
	c := batchRig(t, cfg)
	status, b := c.upload(strings.Repeat(chatLines("x", "fast", 1, 1), 200))
	if status != http.StatusRequestEntityTooLarge {
		t.Fatalf("upload: %d %s", status, b)
	}
	if files := c.object(http.MethodGet, "/v1/files", ""); len(files["data"].([]any)) != 0 {
		t.Fatalf("files after a refused upload: %v", files)
	}
}

// TestBatchCancel: cancelling a running batch stops it: cancelling, then
// cancelled with the results of the lines that finished, and no more.
func TestBatchCancel(t *testing.T) {
	harness.Parallel(t)
	c := batchRig(t, harness.EdgeConfig(nil))
	id := c.createBatch(c.uploadFile(chatLines("s", "slow", 30, 20)), "/v1/chat/completions")
	c.waitBatch(id, "in_progress")
	// iop status shows its progress.
	v, err := status.Fetch(context.Background(), http.DefaultClient, c.base)
	if err != nil || len(v.Batches) != 1 || v.Batches[0].ID != id || v.Batches[0].Total != 30 || v.Batches[0].API != "openai" ||
		!strings.Contains(v.Batches[0].Runner, "/") {
		t.Fatalf("status: %+v %v", v.Batches, err)
	}
	var table strings.Builder
	if err := status.Render(&table, v, time.Now()); err != nil || !strings.Contains(table.String(), "BATCHES (1)") || !strings.Contains(table.String(), id) ||
		!strings.Contains(table.String(), "EDGE") {
		t.Fatalf("status table: %v\n%s", err, table.String())
	}
	b := c.object(http.MethodPost, "/v1/batches/"+id+"/cancel", "")
	if b["status"] != "cancelling" || b["cancelling_at"] == nil {
		t.Fatalf("cancel: %v", b)
	}
	b = c.waitBatch(id, "cancelled")
	total, done, failed := counts(b)
	var out map[string]map[string]any
	if v, ok := b["output_file_id"].(string); ok {
		out = c.resultLines(v)
	}
	if total != 30 || done+failed >= total || len(out) != done {
		t.Fatalf("cancelled batch %v with %d output lines", b, len(out))
	}
	if status, body := c.do(http.MethodPost, "/v1/batches/"+id+"/cancel", "", nil); status != http.StatusConflict {
		t.Fatalf("cancel of a cancelled batch: %d %s", status, body)
	}
}

// TestBatchFilesAndBatchesOfOneKeyHiddenFromAnother: with keys, a file
// and a batch are seen only by the key that made them; the batch's lines
// run as that key.
func TestBatchFilesAndBatchesOfOneKeyHiddenFromAnother(t *testing.T) {
	harness.Parallel(t)
	alice, aliceHash := auth.Generate()
	bob, bobHash := auth.Generate()
	cfg := harness.EdgeConfig(nil)
	cfg.Keys = []auth.Key{{Name: "alice", Hash: aliceHash}, {Name: "bob", Hash: bobHash}}
	c := batchRig(t, cfg)
	a, b := c, c
	a.key, b.key = alice, bob
	fileID := a.uploadFile(chatLines("a", "fast", 2, 4))
	id := a.createBatch(fileID, "/v1/chat/completions")
	for _, path := range []string{"/v1/files/" + fileID, "/v1/files/" + fileID + "/content", "/v1/batches/" + id} {
		if status, _ := b.do(http.MethodGet, path, "", nil); status != http.StatusNotFound {
			t.Errorf("bob: GET %s: %d", path, status)
		}
	}
	if status, _ := c.do(http.MethodGet, "/v1/batches/"+id, "", nil); status != http.StatusUnauthorized {
		t.Errorf("no key: %d", status)
	}
	done := a.waitBatch(id, "completed")
	if _, n, _ := counts(done); n != 2 {
		t.Fatalf("alice's batch: %v", done)
	}
}

// TestBatchResumesAfterTheEdgeIsKilled: `iop edge` killed (SIGKILL) in
// the middle of a batch and started again on the same database finishes
// the batch with every custom_id's result exactly once.
func TestBatchResumesAfterTheEdgeIsKilled(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 40, Seed: 5})
	bin := harness.IOP(t)
	db := filepath.Join(t.TempDir(), "iop.db")
	httpAddr, nodeAddr := testenv.ProcessAddr(t), testenv.ProcessAddr(t)
	first := startEdgeProcess(t, bin, httpAddr, nodeAddr, db)
	ctx, stopNode := context.WithCancel(context.Background())
	defer stopNode()
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: nodeAddr, Providers: []node.ProviderConfig{
		{ID: "o", Type: node.TypeOllama, BaseURL: url, Models: []string{"m"}, Capacity: 2}}})
	c := batchAPI{t: t, base: "http://" + httpAddr}
	const n = 16
	id := c.createBatch(c.uploadFile(chatLines("k", "m", n, 10)), "/v1/chat/completions")
	testenv.EventuallyWithin(t, 2*time.Minute, "a few lines done", func() bool {
		_, done, _ := counts(c.object(http.MethodGet, "/v1/batches/"+id, ""))
		return done >= 3
	})
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()

	startEdgeProcess(t, bin, httpAddr, nodeAddr, db)
	b := c.waitBatch(id, "completed", "failed", "expired")
	out := c.resultLines(b["output_file_id"].(string))
	if total, done, failed := counts(b); b["status"] != "completed" || total != n || done != n || failed != 0 || len(out) != n {
		t.Fatalf("batch after the restart: %v, %d output lines, errors %v", b, len(out), c.resultLines(b["error_file_id"].(string)))
	}
	for i := range n {
		if _, ok := out[fmt.Sprintf("k-%d", i)]; !ok {
			t.Errorf("custom_id k-%d has no result", i)
		}
	}
}

// TestMessageBatchEndToEnd: an Anthropic message batch runs each request
// as POST /v1/messages; its results stream as JSON Lines once it ended,
// one per custom_id, succeeded or errored.
func TestMessageBatchEndToEnd(t *testing.T) {
	harness.Parallel(t)
	c := batchRig(t, harness.EdgeConfig(nil))
	b := c.object(http.MethodPost, "/v1/messages/batches", `{"requests":[
		{"custom_id":"a","params":{"model":"fast","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}},
		{"custom_id":"b","params":{"model":"tunneled","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}},
		{"custom_id":"c","params":{"model":"nope","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}}]}`)
	id := b["id"].(string)
	if b["type"] != "message_batch" || b["processing_status"] != "in_progress" || !strings.HasPrefix(id, "msgbatch_") {
		t.Fatalf("created: %v", b)
	}
	testenv.EventuallyWithin(t, 2*time.Minute, "the message batch to end", func() bool {
		b = c.object(http.MethodGet, "/v1/messages/batches/"+id, "")
		return b["processing_status"] == "ended"
	})
	rc := b["request_counts"].(map[string]any)
	if rc["succeeded"] != float64(2) || rc["errored"] != float64(1) || rc["processing"] != float64(0) || b["results_url"] == nil {
		t.Fatalf("ended: %v", b)
	}
	status, body := c.do(http.MethodGet, "/v1/messages/batches/"+id+"/results", "", nil)
	if status != http.StatusOK {
		t.Fatalf("results: %d %s", status, body)
	}
	types := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(body)), "\n") {
		var l struct {
			CustomID string `json:"custom_id"`
			Result   struct {
				Type    string         `json:"type"`
				Message map[string]any `json:"message"`
			} `json:"result"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("result line %q: %v", line, err)
		}
		if l.Result.Type == "succeeded" && l.Result.Message["type"] != "message" {
			t.Errorf("succeeded without a message: %s", line)
		}
		types[l.CustomID] = l.Result.Type
	}
	if types["a"] != "succeeded" || types["b"] != "succeeded" || types["c"] != "errored" || len(types) != 3 {
		t.Fatalf("results: %v", types)
	}
	list := c.object(http.MethodGet, "/v1/messages/batches", "")
	if data := list["data"].([]any); len(data) != 1 || list["first_id"] != id {
		t.Fatalf("list: %v", list)
	}
}

// TestBatchJavaScriptClients runs test/js/batch_*.mjs, the official
// `openai` (files, batches) and `@anthropic-ai/sdk` (messages.batches)
// clients unchanged, against a real edge and node with an Ollama and an
// OpenAI-compatible simulator (one per execution path) and a slow one.
func TestBatchJavaScriptClients(t *testing.T) {
	harness.Parallel(t)
	nodeBin, files := requireJS(t, "batch_*.mjs")
	_, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{normalizedModel}, Seed: 11})
	_, openaiURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{tunnelModel}, Seed: 11})
	_, slowURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"slow"}, TokensPerSecond: 20, Seed: 11})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := harness.Edge(t, ctx, harness.EdgeConfig(nil))
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "ollama", Type: node.TypeOllama, BaseURL: ollamaURL, Models: []string{normalizedModel}, Capacity: 4},
		{ID: "vllm", Type: "vllm", BaseURL: openaiURL + "/v1", Models: []string{tunnelModel}, Capacity: 4},
		{ID: "slow", Type: node.TypeOllama, BaseURL: slowURL, Models: []string{"slow"}, Capacity: 1},
	}})
	models, _ := json.Marshal([]map[string]string{{"path": "normalized", "model": normalizedModel}, {"path": "tunnel", "model": tunnelModel}})
	runCtx, stop := context.WithTimeout(context.Background(), 3*time.Minute)
	defer stop()
	cmd := exec.CommandContext(runCtx, nodeBin, append([]string{"--test", "--test-reporter=spec"}, files...)...)
	cmd.Env = append(os.Environ(), "IOP_BASE_URL=http://"+e.HTTPAddr, "IOP_MODELS="+string(models), "IOP_SLOW=slow", "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test %v: %v\n%s", files, err, out)
	}
	t.Logf("%s", out)
}

// TestRealOllama_Batch: a batch of chat completions and a message batch
// run on a real Ollama (internal/ollamatest) through a real edge and
// node, every custom_id answered once.
func TestRealOllama_Batch(t *testing.T) {
	harness.ParallelOllama(t)
	s := ollamatest.Start(t)
	s.CreateModel(t, "tiny", ollamatest.Plain)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := harness.Edge(t, ctx, harness.EdgeConfig(nil))
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "ollama", Type: node.TypeOllama, BaseURL: s.URL, Models: []string{"tiny"}, Capacity: 2}}})
	c := batchAPI{t: t, base: "http://" + e.HTTPAddr}
	b := c.waitBatch(c.createBatch(c.uploadFile(chatLines("o", "tiny", 4, 4)), "/v1/chat/completions"), "completed", "failed")
	out := c.resultLines(b["output_file_id"].(string))
	if _, done, _ := counts(b); done != 4 || len(out) != 4 {
		t.Fatalf("batch %v, %d output lines", b, len(out))
	}
	m := c.object(http.MethodPost, "/v1/messages/batches", `{"requests":[{"custom_id":"a","params":{"model":"tiny","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}}]}`)
	testenv.EventuallyWithin(t, 2*time.Minute, "the message batch to end", func() bool {
		m = c.object(http.MethodGet, "/v1/messages/batches/"+m["id"].(string), "")
		return m["processing_status"] == "ended"
	})
	if m["request_counts"].(map[string]any)["succeeded"] != float64(1) {
		t.Fatalf("message batch: %v", m)
	}
}

// TestRealOllama_BatchJavaScriptClients runs test/js/batch_*.mjs, the
// official `openai` and `@anthropic-ai/sdk` clients, against a real edge
// and node on a real Ollama (internal/ollamatest): "tiny" on its native API
// (normalized path), "tiny-v1" on its /v1 (tunnel path) and "crawl", one
// request at a time, for the cancels. The tiny model writes thousands of
// tokens a second, so the lines to cancel ask for 1500 tokens each: 20 of
// them last seconds, and a cancel lands with most of them unrun.
func TestRealOllama_BatchJavaScriptClients(t *testing.T) {
	harness.ParallelOllama(t)
	nodeBin, files := requireJS(t, "batch_*.mjs")
	s := ollamatest.Start(t)
	for _, m := range []string{"tiny", "tiny-v1", "crawl"} {
		s.CreateModel(t, m, ollamatest.Plain)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := harness.Edge(t, ctx, harness.EdgeConfig(nil))
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "native", Type: node.TypeOllama, BaseURL: s.URL, Models: []string{"tiny"}, Capacity: 2},
		{ID: "v1", Type: node.TypeOpenAI, BaseURL: s.URL + "/v1", Models: []string{"tiny-v1"}, Capacity: 2},
		{ID: "crawl", Type: node.TypeOllama, BaseURL: s.URL, Models: []string{"crawl"}, Capacity: 1},
	}})
	models, _ := json.Marshal([]map[string]string{{"path": "normalized", "model": "tiny"}, {"path": "tunnel", "model": "tiny-v1"}})
	runCtx, stop := context.WithTimeout(context.Background(), 4*time.Minute)
	defer stop()
	cmd := exec.CommandContext(runCtx, nodeBin, append([]string{"--test", "--test-reporter=spec"}, files...)...)
	cmd.Env = append(os.Environ(), "IOP_BASE_URL=http://"+e.HTTPAddr, "IOP_MODELS="+string(models),
		"IOP_SLOW=crawl", "IOP_SLOW_MAX_TOKENS=1500", "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test %v: %v\n%s", files, err, out)
	}
	t.Logf("%s", out)
}
