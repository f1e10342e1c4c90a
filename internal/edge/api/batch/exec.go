package batch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"iop/internal/auth"
	"iop/internal/batch"
	"iop/internal/edge/api"
	"iop/internal/edge/contract"
)

// maxAnswerBytes bounds the answer of one batch line the executor keeps.
const maxAnswerBytes = 64 << 20

// Executor runs each batch line through the edge's own HTTP API handler,
// in process: the same route, key checks and limits, admission, dispatch,
// observation and ledger as a client's request, as the batch's key, at
// contract.PriorityBatch (api.WithInternalCaller).
type Executor struct {
	// Handler is the edge's API (api.New's handler).
	Handler http.Handler
	// Keys are the client keys: a batch's owner is one by name.
	Keys *auth.Keyring
}

var _ batch.Executor = (*Executor)(nil)

// errAnswerTooLarge is a line's answer over maxAnswerBytes.
var errAnswerTooLarge = errors.New("answer too large")

// Execute serves a POST of body to path as owner's request. It returns an
// error only when the request did not run to an answer (ctx ended).
func (e *Executor) Execute(ctx context.Context, owner, path string, body []byte) (resp batch.Response, err error) {
	var caller *auth.Caller
	if owner != "" {
		if caller = e.Keys.ByName(owner); caller == nil {
			return batch.Response{Status: http.StatusUnauthorized,
				Body: []byte(`{"error":{"message":"The batch's API key no longer exists","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`)}, nil
		}
	}
	req, err := http.NewRequestWithContext(api.WithInternalCaller(ctx, caller, contract.PriorityBatch), http.MethodPost, path, bytes.NewReader(body))
	if err != nil {
		return batch.Response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if path == "/v1/messages" {
		req.Header.Set("Anthropic-Version", "2023-06-01")
	}
	req.RemoteAddr, req.RequestURI = "127.0.0.1:0", path
	w := &answer{header: http.Header{}}
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler { //nolint:errorlint // the sentinel is panicked as is
				panic(p)
			}
			resp, err = batch.Response{}, fmt.Errorf("batch line aborted: %w", context.Cause(ctx))
		}
	}()
	e.Handler.ServeHTTP(w, req)
	if ctx.Err() != nil {
		return batch.Response{}, context.Cause(ctx)
	}
	if w.tooLarge {
		return batch.Response{Status: http.StatusBadGateway,
			Body: []byte(`{"error":{"message":"The answer is larger than a batch line may keep","type":"server_error","param":null,"code":"answer_too_large"}}`)}, nil
	}
	id := w.header.Get("X-Request-Id")
	if id == "" {
		id = w.header.Get("Request-Id")
	}
	resp = batch.Response{Status: w.status, RequestID: id, Body: w.body.Bytes()}
	if sec, err := strconv.Atoi(w.header.Get("Retry-After")); err == nil && sec > 0 {
		resp.RetryAfter = time.Duration(sec) * time.Second
	}
	return resp, nil
}

// answer is an http.ResponseWriter that keeps the answer in memory, up to
// maxAnswerBytes.
type answer struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	tooLarge bool
}

func (a *answer) Header() http.Header { return a.header }

func (a *answer) WriteHeader(status int) {
	if a.status == 0 {
		a.status = status
	}
}

func (a *answer) Write(p []byte) (int, error) {
	a.WriteHeader(http.StatusOK)
	if a.body.Len()+len(p) > maxAnswerBytes {
		a.tooLarge = true
		return 0, errAnswerTooLarge
	}
	return a.body.Write(p)
}

// Flush is a no-op: the answer is read when the handler returns.
func (a *answer) Flush() {}
