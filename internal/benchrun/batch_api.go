package benchrun

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"time"
)

// batchJob is one batch run through the edge's batch API, as a client
// runs it: the input uploaded with POST /v1/files, the batch created with
// POST /v1/batches, polled with GET /v1/batches/{id}, its output
// downloaded with GET /v1/files/{id}/content.
type batchJob struct {
	url string // the edge's root, http://host:port
	id  string // the batch's id, once created
}

// batchObject is what the bench reads of a batch object (GET
// /v1/batches/{id}); times are Unix seconds, 0 when not reached.
type batchObject struct {
	ID            string `json:"id"`
	Status        string `json:"status"`
	OutputFileID  string `json:"output_file_id"`
	ErrorFileID   string `json:"error_file_id"`
	CreatedAt     int64  `json:"created_at"`
	InProgressAt  int64  `json:"in_progress_at"`
	FinalizingAt  int64  `json:"finalizing_at"`
	CompletedAt   int64  `json:"completed_at"`
	RequestCounts struct {
		Total     int `json:"total"`
		Completed int `json:"completed"`
		Failed    int `json:"failed"`
	} `json:"request_counts"`
}

// batchInput is the JSONL input of a batch of lines chat requests for
// model: line i has custom_id "line-<i>" and asks for 1 + i mod
// maxTokens tokens.
func batchInput(model string, lines, maxTokens int) []byte {
	var b bytes.Buffer
	for i := range lines {
		fmt.Fprintf(&b, `{"custom_id":"line-%d","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"messages":[{"role":"user","content":"batch line %d"}],"max_tokens":%d}}`+"\n",
			i, model, i, 1+i%maxTokens)
	}
	return b.Bytes()
}

// submit uploads input (purpose batch) and creates the batch of chat
// completions on it, with a 24 h completion window.
func (j *batchJob) submit(ctx context.Context, input []byte) error {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	if err := mw.WriteField("purpose", "batch"); err != nil {
		return err
	}
	fw, err := mw.CreateFormFile("file", "bench-batch.jsonl")
	if err != nil {
		return err
	}
	if _, err := fw.Write(input); err != nil {
		return err
	}
	if err := mw.Close(); err != nil {
		return err
	}
	var file struct {
		ID string `json:"id"`
	}
	if err := j.call(ctx, http.MethodPost, "/v1/files", mw.FormDataContentType(), &body, &file); err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	create, err := json.Marshal(map[string]string{"input_file_id": file.ID, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
	if err != nil {
		return err
	}
	var b batchObject
	if err := j.call(ctx, http.MethodPost, "/v1/batches", "application/json", bytes.NewReader(create), &b); err != nil {
		return fmt.Errorf("create batch: %w", err)
	}
	j.id = b.ID
	return nil
}

// get reads the batch.
func (j *batchJob) get(ctx context.Context) (batchObject, error) {
	var b batchObject
	err := j.call(ctx, http.MethodGet, "/v1/batches/"+j.id, "", nil, &b)
	return b, err
}

// cancel asks the edge to cancel the batch.
func (j *batchJob) cancel(ctx context.Context) error {
	return j.call(ctx, http.MethodPost, "/v1/batches/"+j.id+"/cancel", "application/json", nil, nil)
}

// call sends one request of the batch API and decodes a 200 answer's
// JSON into out (nil: discarded); any other status is an error naming it.
func (j *batchJob) call(ctx context.Context, method, path, contentType string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, j.url+path, body)
	if err != nil {
		return err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// terminal reports whether a batch in status is done changing.
func terminal(status string) bool {
	switch status {
	case "completed", "failed", "expired", "cancelled":
		return true
	}
	return false
}

// BatchOutput is what the bench found in a batch's result files.
type BatchOutput struct {
	// Lines is the output file's result lines; OK those whose response
	// has status_code 200; Errors the error file's lines.
	Lines  int `json:"lines"`
	OK     int `json:"ok"`
	Errors int `json:"errors"`
	// Missing and Duplicated count the input's custom_ids absent from
	// both files, and those found more than once.
	Missing    int `json:"missing"`
	Duplicated int `json:"duplicated"`
}

// Complete reports whether every one of lines input lines has exactly one
// successful result line.
func (o BatchOutput) Complete(lines int) bool {
	return o.Lines == lines && o.OK == lines && o.Errors == 0 && o.Missing == 0 && o.Duplicated == 0
}

// checkOutput downloads b's output and error files and counts their
// result lines against the input's lines custom_ids (line-0 …).
func (j *batchJob) checkOutput(ctx context.Context, b batchObject, lines int) (BatchOutput, error) {
	var out BatchOutput
	seen := make(map[string]int, lines)
	for _, f := range []struct {
		id     string
		output bool
	}{{b.OutputFileID, true}, {b.ErrorFileID, false}} {
		if f.id == "" {
			continue
		}
		data, err := j.content(ctx, f.id)
		if err != nil {
			return out, err
		}
		n, ok, err := countResults(data, seen)
		if err != nil {
			return out, fmt.Errorf("file %s: %w", f.id, err)
		}
		if f.output {
			out.Lines, out.OK = n, ok
		} else {
			out.Errors = n
		}
	}
	for i := range lines {
		switch seen[fmt.Sprintf("line-%d", i)] {
		case 0:
			out.Missing++
		case 1:
		default:
			out.Duplicated++
		}
	}
	return out, nil
}

// content downloads a file's bytes.
func (j *batchJob) content(ctx context.Context, id string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.url+"/v1/files/"+id+"/content", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/files/%s/content: %s", id, resp.Status)
	}
	return data, nil
}

// countResults counts the result lines of a batch result file (JSONL of
// {"custom_id", "response": {"status_code"}, "error"}) into seen by
// custom_id, and returns how many there were and how many answered 200.
func countResults(data []byte, seen map[string]int) (n, ok int, err error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var line struct {
			CustomID string `json:"custom_id"`
			Response *struct {
				StatusCode int `json:"status_code"`
			} `json:"response"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return n, ok, fmt.Errorf("result line %d: %w", n+1, err)
		}
		n++
		seen[line.CustomID]++
		if line.Response != nil && line.Response.StatusCode == http.StatusOK {
			ok++
		}
	}
	return n, ok, sc.Err()
}

// waitListening waits until something accepts TCP connections on addr,
// dialing every 20 ms, for at most timeout.
func waitListening(ctx context.Context, addr string, timeout time.Duration, procs []*process) error {
	return waitFor(ctx, timeout, procs, func() error {
		c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	})
}
