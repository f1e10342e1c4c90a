package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// mediaCaps are the capabilities of a provider serving every media route.
var mediaCaps = []string{"rerank", "transcription", "speech", "images", "infill", "llama_completion"}

// mediaRig is an edge with a small body limit (1 MiB) and a larger
// upload limit, a node over gRPC with provider "p" (the simulator, every
// media capability, model "m", alias "asr" of it) and provider "plain"
// (model "chat-only", no media capability).
type mediaRig struct {
	e   *process.Process
	sim *sim.Server
	db  string
	url string
}

func newMediaRig(t *testing.T, maxUpload int64, opts ...func(*process.EdgeFile)) *mediaRig {
	t.Helper()
	s, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m", "chat-only"}, DefaultMaxTokens: 8})
	cfg := harness.EdgeConfig(map[string]edge.ModelConfig{"asr": {Targets: []string{"m"}}})
	db := filepath.Join(t.TempDir(), "edge.db")
	cfg.Database = db
	cfg.MaxBodyBytes = 1 << 20
	cfg.MaxUploadBytes = maxUpload
	for _, o := range opts {
		o(&cfg)
	}
	ctx := context.Background()
	e := harness.Edge(t, ctx, cfg)
	harness.Node(t, ctx, node.Config{NodeID: "n", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "p", Type: "vllm", BaseURL: url + "/v1", Models: []string{"m"}, Capacity: 2, Capabilities: mediaCaps},
		{ID: "plain", Type: "vllm", BaseURL: url + "/v1", Models: []string{"chat-only"}, Capacity: 1},
	}})
	return &mediaRig{e: e, sim: s, db: db, url: "http://" + e.HTTPAddr}
}

// lastSeen is the simulator's last request on path.
func (rig *mediaRig) lastSeen(t *testing.T, path string) sim.SeenRequest {
	t.Helper()
	seen := rig.sim.Seen()
	for i := len(seen) - 1; i >= 0; i-- {
		if seen[i].Path == path {
			return seen[i]
		}
	}
	t.Fatalf("the simulator saw no request on %s", path)
	return sim.SeenRequest{}
}

// lastAnswer is the simulator's last answer on path.
func (rig *mediaRig) lastAnswer(t *testing.T, path string) sim.MediaAnswer {
	t.Helper()
	answers := rig.sim.MediaAnswers()
	for i := len(answers) - 1; i >= 0; i-- {
		if answers[i].Path == path {
			return answers[i]
		}
	}
	t.Fatalf("the simulator answered nothing on %s", path)
	return sim.MediaAnswer{}
}

// ledgerRow is the usage_ledger row of requestID: its run id and outcome
// ("" and "" while there is none).
func (rig *mediaRig) ledgerRow(t *testing.T, requestID string) (runID, outcome string) {
	t.Helper()
	rig.e.Ledger.Flush()
	db, err := sql.Open("sqlite", "file:"+rig.db+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.QueryRow(`SELECT run_id, outcome FROM usage_ledger WHERE request_id = ?`, requestID).Scan(&runID, &outcome)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("the ledger row of request %s: %v", requestID, err)
	}
	return runID, outcome
}

func hexSum(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestMediaRoutesRelayByteForByte: each media route, through a real edge,
// node (gRPC) and simulator, delivers the client's body to the simulator
// unchanged and the simulator's answer to the client unchanged, streamed
// answers included (speech's audio chunks, llama.cpp's /completion SSE,
// which ends without [DONE]), with one usage ledger row per request, and
// no slot held after.
func TestMediaRoutesRelayByteForByte(t *testing.T) {
	harness.Parallel(t)
	rig := newMediaRig(t, 0)
	for _, tc := range []struct {
		name, path, simPath, body string
		check                     func(t *testing.T, answer []byte, header http.Header)
	}{
		{"rerank", "/v1/rerank", "/v1/rerank",
			`{"model":"m","query":"what is a panda?","documents":["hi","The giant panda is a bear native to China.",{"text":"pandas eat bamboo"}],"top_n":2}`,
			func(t *testing.T, answer []byte, _ http.Header) {
				var out struct {
					Results []struct {
						Index int     `json:"index"`
						Score float64 `json:"relevance_score"`
					} `json:"results"`
				}
				if err := json.Unmarshal(answer, &out); err != nil || len(out.Results) != 2 || out.Results[0].Score < out.Results[1].Score {
					t.Errorf("rerank answer %s: want 2 results, best first", answer)
				}
			}},
		{"rerank at the root", "/rerank", "/v1/rerank", `{"model":"m","query":"q","documents":["q a","b"]}`, nil},
		{"speech", "/v1/audio/speech", "/v1/audio/speech", `{"model":"m","input":"Hello there, how are you today?","voice":"alloy","response_format":"wav"}`,
			func(t *testing.T, answer []byte, header http.Header) {
				if header.Get("Content-Type") != "audio/wav" || !bytes.HasPrefix(answer, []byte("RIFF")) {
					t.Errorf("speech answer: Content-Type %q, starts %q", header.Get("Content-Type"), answer[:min(len(answer), 4)])
				}
			}},
		{"images", "/v1/images/generations", "/v1/images/generations", `{"model":"m","prompt":"a red square","n":2,"size":"32x32","response_format":"b64_json"}`, nil},
		{"infill", "/infill", "/infill", `{"model":"m","input_prefix":"def add(a, b):\n    ","input_suffix":"\n","n_predict":5}`, nil},
		{"completion streamed", "/completion", "/completion", `{"model":"m","prompt":"Once upon a time","n_predict":6,"stream":true}`,
			func(t *testing.T, answer []byte, header http.Header) {
				if !strings.HasPrefix(header.Get("Content-Type"), "text/event-stream") || bytes.Contains(answer, []byte("[DONE]")) ||
					!bytes.Contains(answer, []byte(`"stop":true`)) {
					t.Errorf("llama.cpp stream: Content-Type %q, body %s", header.Get("Content-Type"), answer)
				}
			}},
		{"completion", "/completion", "/completion", `{"model":"m","prompt":"Once upon a time","n_predict":6}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(rig.url+tc.path, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			answer, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, err %v: %s", resp.StatusCode, err, answer)
			}
			if got := rig.lastSeen(t, tc.simPath); got.BodySHA256 != hexSum([]byte(tc.body)) || got.BodyBytes != int64(len(tc.body)) {
				t.Errorf("the simulator received %d bytes (sha256 %s), the client sent %d", got.BodyBytes, got.BodySHA256, len(tc.body))
			}
			if got := rig.lastAnswer(t, tc.simPath); got.BodySHA256 != hexSum(answer) || got.BodyBytes != int64(len(answer)) {
				t.Errorf("the client received %d bytes, the simulator sent %d", len(answer), got.BodyBytes)
			}
			if tc.check != nil {
				tc.check(t, answer, resp.Header)
			}
			// The row is written once the request ended, which may be
			// just after the client read its answer.
			id := resp.Header.Get("X-Request-Id")
			var runID, outcome string
			testenv.Eventually(t, "the request's usage ledger row", func() bool {
				runID, outcome = rig.ledgerRow(t, id)
				return outcome != ""
			})
			if runID == "" || outcome != "completed" {
				t.Errorf("ledger row: run %q outcome %q, want a run, completed", runID, outcome)
			}
		})
	}
	waitIdle(t, rig.e)
}

// multipartBody writes a transcription body to w: the fields in order
// ("file" is fileBytes deterministic bytes), and returns its boundary.
func multipartBody(w io.Writer, order []string, model string, fileBytes int64) (string, error) {
	mw := multipart.NewWriter(w)
	for _, name := range order {
		switch name {
		case "file":
			fw, err := mw.CreateFormFile("file", "speech.wav")
			if err != nil {
				return "", err
			}
			if _, err := io.CopyN(fw, newPattern(), fileBytes); err != nil {
				return "", err
			}
		case "model":
			if err := mw.WriteField("model", model); err != nil {
				return "", err
			}
		default:
			if err := mw.WriteField(name, "json"); err != nil {
				return "", err
			}
		}
	}
	return mw.Boundary(), mw.Close()
}

// patternBlock is what a pattern repeats: 64 KiB of bytes, not all equal.
var patternBlock = func() []byte {
	b := make([]byte, 64<<10)
	x := byte(0)
	for i := range b {
		b[i] = x
		x = x*31 + 7
	}
	return b
}()

// pattern is an endless reader of patternBlock, again and again.
type pattern struct{ off int }

func newPattern() *pattern { return &pattern{} }

func (p *pattern) Read(b []byte) (int, error) {
	n := copy(b, patternBlock[p.off:])
	p.off = (p.off + n) % len(patternBlock)
	return n, nil
}

// TestMediaTranscriptionRelaysTheUpload: a multipart upload reaches the
// simulator byte for byte, with its model field first (OpenAI's Python
// SDK) or after the file (its Node SDK, curl's documented order); for an
// alias, the model field is the served model's name and nothing else
// changes.
func TestMediaTranscriptionRelaysTheUpload(t *testing.T) {
	harness.Parallel(t)
	rig := newMediaRig(t, 0)
	for _, tc := range []struct {
		name  string
		order []string
		model string
		file  int64
	}{
		{"model first", []string{"model", "file", "response_format"}, "m", 200 << 10},
		{"file first, larger than the held prefix", []string{"file", "response_format", "model"}, "m", 3 << 20},
		{"alias rewritten", []string{"file", "model"}, "asr", 100 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body bytes.Buffer
			boundary, err := multipartBody(&body, tc.order, tc.model, tc.file)
			if err != nil {
				t.Fatal(err)
			}
			sent := body.Bytes()
			resp, err := http.Post(rig.url+"/v1/audio/transcriptions", "multipart/form-data; boundary="+boundary, bytes.NewReader(sent))
			if err != nil {
				t.Fatal(err)
			}
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !bytes.Contains(answer, []byte(`"text"`)) {
				t.Fatalf("status %d: %s", resp.StatusCode, answer)
			}
			want := sent
			if tc.model != "m" {
				want = bytes.Replace(sent, []byte("\r\n\r\n"+tc.model+"\r\n"), []byte("\r\n\r\nm\r\n"), 1)
			}
			if got := rig.lastSeen(t, "/v1/audio/transcriptions"); got.BodySHA256 != hexSum(want) || got.BodyBytes != int64(len(want)) || got.Model != "m" {
				t.Errorf("the simulator received %d bytes of model %q, want %d bytes as sent (model m)", got.BodyBytes, got.Model, len(want))
			}
			if got := rig.lastAnswer(t, "/v1/audio/transcriptions"); got.BodySHA256 != hexSum(answer) {
				t.Errorf("the client's answer differs from the simulator's")
			}
		})
	}
	waitIdle(t, rig.e)
}

// TestMediaUploadLargerThanMemoryLimitsIsStreamed: an upload of 32 MiB,
// 32 times the edge's body limit, reaches the simulator whole (the bytes
// relayed are the bytes sent) while the process's heap (edge, node and
// simulator are all in it) grows by far less than the body: the upload is
// never held. Heap is sampled with runtime.MemStats while it goes, with
// the collector set to run often so that garbage does not count.
func TestMediaUploadLargerThanMemoryLimitsIsStreamed(t *testing.T) {
	// In a process of its own: it sets the collector's percentage and
	// measures the process's heap.
	if testenv.RunInOwnProcess(t) {
		return
	}
	rig := newMediaRig(t, 64<<20)
	const size = 32 << 20
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)

	pr, pw := io.Pipe()
	sum := sha256.New()
	var sent atomic.Int64
	boundary := make(chan string, 1)
	go func() {
		mw := io.MultiWriter(pw, sum, countWriter{&sent})
		_, err := multipartBody(&boundaryTap{w: mw, boundary: boundary}, []string{"model", "file"}, "m", size)
		pw.CloseWithError(err)
	}()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				runtime.ReadMemStats(&ms)
				if ms.HeapAlloc > peak.Load() {
					peak.Store(ms.HeapAlloc)
				}
			}
		}
	}()
	req, err := http.NewRequest(http.MethodPost, rig.url+"/v1/audio/transcriptions", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "multipart/form-data; boundary="+<-boundary)
	resp, err := http.DefaultClient.Do(req)
	close(stop)
	<-sampled
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, answer)
	}
	got := rig.lastSeen(t, "/v1/audio/transcriptions")
	if got.BodyBytes != sent.Load() || got.BodySHA256 != hex.EncodeToString(sum.Sum(nil)) {
		t.Errorf("the simulator received %d bytes, the client sent %d (or they differ)", got.BodyBytes, sent.Load())
	}
	grew := int64(peak.Load()) - int64(base.HeapAlloc)
	t.Logf("heap: %d MiB before, peak %d MiB during the %d MiB upload", base.HeapAlloc>>20, peak.Load()>>20, size>>20)
	if grew > size/4 {
		t.Errorf("the heap grew by %d MiB during a %d MiB upload: it was held, not streamed", grew>>20, size>>20)
	}
	waitIdle(t, rig.e)
}

// countWriter counts the bytes written.
type countWriter struct{ n *atomic.Int64 }

func (c countWriter) Write(p []byte) (int, error) { c.n.Add(int64(len(p))); return len(p), nil }

// boundaryTap passes writes to w and sends the multipart boundary, read
// from the first line written, on boundary.
type boundaryTap struct {
	w        io.Writer
	boundary chan<- string
	sent     bool
}

func (b *boundaryTap) Write(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		line, _, _ := bytes.Cut(p, []byte("\r\n"))
		b.boundary <- strings.TrimPrefix(string(line), "--")
	}
	return b.w.Write(p)
}

// TestMediaUploadCancelledMidwayReleasesTheSlot: a client that goes away
// in the middle of its upload, while the run holds its slot, ends the run:
// the provider's in-flight count returns to 0 and no lease is left.
func TestMediaUploadCancelledMidwayReleasesTheSlot(t *testing.T) {
	harness.Parallel(t)
	rig := newMediaRig(t, 0)
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rig.url+"/v1/audio/transcriptions", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("answered %d", resp.StatusCode)
		}
		done <- err
	}()
	if err := mw.WriteField("model", "m"); err != nil {
		t.Fatal(err)
	}
	fw, err := mw.CreateFormFile("file", "a.wav")
	if err != nil {
		t.Fatal(err)
	}
	// Upload until the run holds its provider's slot, then a bit more.
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		_, _ = io.Copy(fw, newPattern()) // until the pipe is closed
	}()
	testenv.Eventually(t, "the upload's run holds its slot", func() bool {
		for _, p := range rig.e.Service.Snapshot().Providers {
			if p.ProviderID == "p" && p.InFlight == 1 {
				return true
			}
		}
		return false
	})
	cancel()
	pw.CloseWithError(context.Canceled)
	<-writing
	if err := <-done; err == nil || !strings.Contains(err.Error(), "context canceled") {
		t.Errorf("the cancelled upload ended with %v", err)
	}
	waitIdle(t, rig.e)
}

// TestMediaRoutesRefuseInTheirShape: a model whose providers lack the
// route's capability is answered 400 unsupported_capability naming it, an
// unknown model 404, a body without a model 400, and a transcription that
// is not multipart 400; never a 502.
func TestMediaRoutesRefuseInTheirShape(t *testing.T) {
	harness.Parallel(t)
	rig := newMediaRig(t, 2<<20)
	var big bytes.Buffer
	bigBoundary, err := multipartBody(&big, []string{"model", "file"}, "m", 3<<20)
	if err != nil {
		t.Fatal(err)
	}
	// A second model field after a file the edge relays before it sees it.
	var twice bytes.Buffer
	mw := multipart.NewWriter(&twice)
	_ = mw.WriteField("model", "m")
	fw, _ := mw.CreateFormFile("file", "a.wav")
	_, _ = io.CopyN(fw, newPattern(), 1<<20)
	_ = mw.WriteField("model", "chat-only")
	_ = mw.Close()
	for _, tc := range []struct {
		name, path, contentType, body string
		status                        int
		code, mention                 string
		chunked                       bool // no Content-Length: the limit is met while relaying
	}{
		{"upload over max_upload_bytes", "/v1/audio/transcriptions", "multipart/form-data; boundary=" + bigBoundary, big.String(), 413, "request_too_large", "", false},
		{"chunked upload over max_upload_bytes", "/v1/audio/transcriptions", "multipart/form-data; boundary=" + bigBoundary, big.String(), 413, "request_too_large", "", true},
		{"no provider has rerank", "/v1/rerank", "application/json", `{"model":"chat-only","query":"q","documents":["a"]}`, 400, "unsupported_capability", "rerank", false},
		{"no provider has speech", "/v1/audio/speech", "application/json", `{"model":"chat-only","input":"hi","voice":"alloy"}`, 400, "unsupported_capability", "speech", false},
		{"unknown model", "/v1/images/generations", "application/json", `{"model":"nope","prompt":"x"}`, 404, "model_not_found", "nope", false},
		{"no model", "/infill", "application/json", `{"input_prefix":"a","input_suffix":"b"}`, 400, "invalid_request", "model", false},
		{"no documents", "/rerank", "application/json", `{"model":"m","query":"q"}`, 400, "invalid_request", "documents", false},
		{"not multipart", "/v1/audio/transcriptions", "application/json", `{"model":"m"}`, 400, "invalid_request", "multipart", false},
		{"model field repeated", "/v1/audio/transcriptions", mw.FormDataContentType(), twice.String(), 400, "invalid_request", "model", true},
		{"no model field", "/v1/audio/transcriptions", "multipart/form-data; boundary=XX", "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nabc\r\n--XX--\r\n", 400, "invalid_request", "model", false},
		{"JSON body over the body limit", "/v1/rerank", "application/json", `{"model":"m","query":"` + strings.Repeat("q", 2<<20) + `"}`, 413, "request_too_large", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader = strings.NewReader(tc.body)
			if tc.chunked {
				body = io.MultiReader(body)
			}
			resp, err := http.Post(rig.url+tc.path, tc.contentType, body)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var out struct {
				Error struct {
					Message string  `json:"message"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			raw, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(raw, &out); err != nil || resp.StatusCode != tc.status || out.Error.Code == nil ||
				*out.Error.Code != tc.code || !strings.Contains(out.Error.Message, tc.mention) {
				t.Errorf("status %d %s, want %d code %s mentioning %q", resp.StatusCode, raw, tc.status, tc.code, tc.mention)
			}
		})
	}
	waitIdle(t, rig.e)
}
