package batch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// Causes that end a batch's work early.
var (
	errCancelled = errors.New("batch cancelled")
	errExpired   = errors.New("batch expired")
)

// maxValidationErrors bounds the errors a failed validation keeps.
const maxValidationErrors = 100

// maxLineBytes bounds one line of an input file.
const maxLineBytes = 16 << 20

// job runs one batch: validation, its lines, finalization, while its
// service holds the batch's lease (epoch). Its goroutine (run) is the
// sole writer of the batch's status but for a cancel, which moves it to
// cancelling (cancelled).
type job struct {
	s                                  *Service
	id, owner, kind, endpoint, inputID string    // the batch's, immutable
	epoch                              int64     // the lease's, immutable
	resumed                            time.Time // when it was claimed from an earlier runner; zero for a new batch

	mu        sync.Mutex // guards the fields below
	b         Batch
	cancelRun context.CancelCauseFunc // ends the lines in flight; nil before run
	loseLease context.CancelCauseFunc // ends the job without a final status; nil before run
	// quotaWaits counts the lines waiting for the key's quota (quotaWait).
	quotaWaits int
}

func newJob(s *Service, b Batch) *job {
	return &job{s: s, id: b.ID, owner: b.Owner, kind: b.Kind, endpoint: b.Endpoint, inputID: b.InputFileID, epoch: b.Epoch, b: b}
}

// cancelled adopts a cancel stored (Store.RequestCancel) as stored shows
// it and ends the lines in flight.
func (j *job) cancelled(stored Batch) {
	j.mu.Lock()
	defer j.mu.Unlock()
	switch j.b.Status {
	case StatusValidating, StatusInProgress:
		j.b.Status, j.b.CancellingAt = StatusCancelling, stored.CancellingAt
	}
	if j.b.Status == StatusCancelling && j.cancelRun != nil {
		j.cancelRun(errCancelled)
	}
}

// lost ends the job without a final status: another service holds the
// batch's lease now.
func (j *job) lost(err error) {
	j.mu.Lock()
	lose := j.loseLease
	j.mu.Unlock()
	if lose != nil {
		j.s.logger.Warn("batch lease lost: another runner has it", "batch", j.id, "epoch", j.epoch, "err", err)
		lose(ErrLeaseLost)
	}
}

// keepLease renews the lease every third of LeaseTTL until ctx ends; it
// ends the job (lost) when another claim took the lease, or when the
// store did not answer for so long that the lease may have lapsed, and
// adopts a cancel another service stored.
func (j *job) keepLease(ctx context.Context) {
	ttl := j.s.cfg.LeaseTTL
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	renewed := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		status, ok, err := j.s.store.Renew(ctx, j.id, j.epoch, ttl)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && time.Since(renewed) < ttl-ttl/3:
			j.s.logger.Warn("batch lease not renewed", "batch", j.id, "err", err)
			continue
		case err != nil:
			j.lost(err)
			return
		case !ok:
			j.lost(ErrLeaseLost)
			return
		}
		renewed = time.Now()
		if status == StatusCancelling && j.status() != StatusCancelling {
			if b, err := j.s.store.GetBatch(ctx, j.owner, j.id); err == nil {
				j.cancelled(b)
			}
		}
	}
}

// run takes the batch from its stored status to its end, unless parent
// ends first (the service closes) or the lease is lost: then the batch
// stays as it is, to be resumed by whoever claims it next.
func (j *job) run(parent context.Context) {
	leased, loseLease := context.WithCancelCause(parent)
	ctx, cancel := context.WithCancelCause(leased)
	defer cancel(nil)
	j.mu.Lock()
	j.cancelRun, j.loseLease = cancel, loseLease
	if j.b.Status == StatusCancelling {
		cancel(errCancelled)
	}
	expires := j.b.ExpiresAt
	j.mu.Unlock()
	defer func() {
		if err := j.s.store.Release(context.Background(), j.id, j.epoch); err != nil {
			j.s.logger.Warn("batch lease not released", "batch", j.id, "err", err)
		}
	}()
	var renewals sync.WaitGroup
	defer renewals.Wait()
	renewals.Go(func() { j.keepLease(leased) })
	defer loseLease(nil) // stops keepLease before the Release
	expiry := time.AfterFunc(time.Until(expires), func() { cancel(errExpired) })
	defer expiry.Stop()
	log := j.s.logger.With("batch", j.id)

	if j.status() == StatusValidating {
		// Validation is bounded by the file's size and runs to its end
		// even when the batch is cancelled meanwhile.
		ok, err := j.validate(context.WithoutCancel(ctx))
		if err != nil {
			if leased.Err() == nil {
				log.Error("batch validation failed", "err", err)
				j.fail([]LineError{{Code: "internal_error", Message: "The input file could not be read."}})
			}
			return
		}
		if !ok {
			return
		}
	}
	if st := j.status(); st == StatusInProgress {
		if err := j.work(ctx); err != nil && leased.Err() == nil {
			log.Error("batch lines could not be read", "err", err)
		}
	}
	if leased.Err() != nil {
		return // the service closed or the lease was lost: resumed by the next claim
	}
	final := StatusCompleted
	switch context.Cause(ctx) {
	case errExpired:
		final = StatusExpired
	case errCancelled:
		final = StatusCancelled
	}
	if err := j.finalize(leased, final); err != nil && leased.Err() == nil {
		log.Error("batch finalization failed", "err", err)
	}
}

func (j *job) status() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.b.Status
}

// save applies change to the batch and stores it, unless the batch is
// cancelling (here, or stored by another service) and change would leave
// that: then it reports false. A lease lost ends the job (ErrLeaseLost).
func (j *job) save(change func(b *Batch)) (bool, error) {
	j.mu.Lock()
	next := j.b
	change(&next)
	if j.b.Status == StatusCancelling && next.Status != StatusCancelled {
		j.mu.Unlock()
		return false, nil
	}
	err := j.s.store.UpdateBatch(context.Background(), next)
	if err == nil {
		j.b = next
	}
	j.mu.Unlock()
	switch {
	case errors.Is(err, ErrState): // cancelled through another service
		stored, gerr := j.s.store.GetBatch(context.Background(), j.owner, j.id)
		if gerr != nil {
			return false, gerr
		}
		j.cancelled(stored)
		return false, nil
	case errors.Is(err, ErrLeaseLost):
		j.lost(err)
	}
	return err == nil, err
}

// fail ends the batch as failed with errs, and drops the lines its
// validation stored before it failed: a failed batch holds no request
// (request_counts.total 0, as OpenAI's).
// The lines go first, so the batch is never seen failed with a total.
func (j *job) fail(errs []LineError) {
	if err := j.s.store.DropLines(context.Background(), j.id); err != nil {
		j.s.logger.Error("failed batch's lines not dropped", "batch", j.id, "err", err)
	}
	_, err := j.save(func(b *Batch) {
		b.Status, b.FailedAt, b.Errors, b.Total = StatusFailed, j.s.cfg.Now(), errs, 0
	})
	if err != nil {
		j.s.logger.Error("batch status not saved", "batch", j.id, "err", err)
	}
}

// utf8BOM is the byte order mark some editors put before a UTF-8 file's
// first line.
var utf8BOM = []byte("\xef\xbb\xbf")

// inputLine is one line of an OpenAI batch input file.
type inputLine struct {
	CustomID *string         `json:"custom_id"`
	Method   *string         `json:"method"`
	URL      *string         `json:"url"`
	RawBody  json.RawMessage `json:"body"`
}

// validate reads the input file line by line (never whole), storing its
// lines a chunk at a time, and either moves the batch to in_progress
// (true) or fails it with the errors found, each naming its line (false;
// lines stored by then stay inert).
func (j *job) validate(ctx context.Context) (bool, error) {
	_, rc, err := j.s.Content(ctx, j.owner, j.inputID)
	if err != nil {
		return false, err
	}
	defer rc.Close()
	total := 0
	errs, err := parseInput(rc, j.endpoint, func(lines []Line) error {
		total += len(lines)
		return j.s.store.AddLines(ctx, j.id, lines)
	})
	if err != nil {
		return false, err
	}
	if len(errs) > 0 {
		j.fail(errs)
		return false, nil
	}
	ok, err := j.save(func(b *Batch) { b.Status, b.InProgressAt, b.Total = StatusInProgress, j.s.cfg.Now(), total })
	if err == nil && !ok {
		return true, nil // cancelling: its finalization still runs
	}
	return ok, err
}

// linesPerChunk is how many lines parseInput hands over at once.
const linesPerChunk = 1000

// parseInput reads an OpenAI batch input file from r as a stream: one
// JSON object {custom_id, method "POST", url endpoint, body {...}} a
// line, custom_ids unique, at most MaxLines. It hands the good lines to
// emit a chunk at a time (none once an error was found) and returns the
// errors found, each naming its 1-based line (at most
// maxValidationErrors; "empty_file" for a file of no request). err is
// r's or emit's failure.
func parseInput(r io.Reader, endpoint string, emit func([]Line) error) (errs []LineError, err error) {
	addErr := func(line int, code, param, format string, args ...any) {
		if len(errs) >= maxValidationErrors {
			return
		}
		e := LineError{Code: code, Message: fmt.Sprintf(format, args...)}
		if line > 0 {
			e.Line = &line
		}
		if param != "" {
			e.Param = &param
		}
		errs = append(errs, e)
	}
	var chunk []Line
	flush := func() error {
		if len(chunk) == 0 || len(errs) > 0 {
			chunk = chunk[:0]
			return nil
		}
		err := emit(chunk)
		chunk = nil
		return err
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLineBytes)
	no := 0
	for sc.Scan() {
		no++
		raw := sc.Bytes()
		if no == 1 {
			raw = bytes.TrimPrefix(raw, utf8BOM) // an editor's byte order mark
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue // a blank line (a trailing newline) is no request
		}
		var in inputLine
		if err := json.Unmarshal(raw, &in); err != nil {
			if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
				addErr(no, "invalid_value", te.Field, "The %s must be a string, not %s.", te.Field, te.Value)
				continue
			}
			addErr(no, "invalid_json_line", "", "This line is not parseable as valid JSON.")
			continue
		}
		switch {
		case in.CustomID == nil || *in.CustomID == "":
			addErr(no, "missing_required_parameter", "custom_id", "Missing required parameter: 'custom_id'.")
		case in.Method == nil || *in.Method != "POST":
			addErr(no, "invalid_value", "method", "The method must be POST.")
		case in.URL == nil || *in.URL != endpoint:
			addErr(no, "mismatched_endpoint", "url", "The url must be the batch's endpoint %s.", endpoint)
		case len(in.RawBody) == 0 || in.RawBody[0] != '{':
			addErr(no, "missing_required_parameter", "body", "Missing required parameter: 'body' (an object).")
		case seen[*in.CustomID]:
			addErr(no, "duplicate_custom_id", "custom_id", "The custom_id %q is used by an earlier line.", *in.CustomID)
		case len(seen) >= MaxLines:
			addErr(no, "too_many_requests", "", "A batch holds at most %d requests.", MaxLines)
		default:
			seen[*in.CustomID] = true
			chunk = append(chunk, Line{No: no, CustomID: *in.CustomID, Body: bytes.Clone(in.RawBody)})
			if len(chunk) >= linesPerChunk {
				if err := flush(); err != nil {
					return nil, err
				}
			}
		}
	}
	switch {
	case errors.Is(sc.Err(), bufio.ErrTooLong):
		addErr(no+1, "invalid_json_line", "", "This line is longer than %d bytes.", maxLineBytes)
	case sc.Err() != nil:
		return nil, sc.Err()
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if len(errs) == 0 && len(seen) == 0 {
		addErr(0, "empty_file", "", "The input file holds no request.")
	}
	return errs, nil
}

// work runs the batch's pending lines, Concurrency at a time, until all
// have results or ctx ends.
func (j *job) work(ctx context.Context) error {
	pending, err := j.s.store.PendingLines(ctx, j.id)
	if err != nil {
		return err
	}
	if !j.waitReady(ctx) {
		return nil
	}
	next := make(chan Line)
	var wg sync.WaitGroup
	for range min(j.s.cfg.Concurrency, len(pending)) {
		wg.Go(func() {
			for l := range next {
				j.runLine(ctx, l)
			}
		})
	}
	defer wg.Wait()
	defer close(next)
	for _, l := range pending {
		select {
		case next <- l:
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

// runLine executes one line, retrying refusals (retryable) up to
// MaxAttempts — a refusal with a Retry-After, or while the edge is not
// ready, waits without counting — and records its result once; a line
// whose execution ctx ended stays pending.
func (j *job) runLine(ctx context.Context, l Line) {
	s := j.s
	var resp Response
	if field := refusedField(j.endpoint, l.Body); field != "" {
		resp = Response{Status: 400, Body: fieldRefusal(j.kind, field)}
	} else {
		delay := s.cfg.RetryDelay
		for attempt := 1; ; attempt++ {
			var err error
			resp, err = s.exec.Execute(ctx, j.owner, j.endpoint, l.Body)
			if err != nil {
				return
			}
			if !j.retryable(resp) {
				break
			}
			wait, quota := delay, false
			switch {
			case s.cfg.Ready != nil && !s.cfg.Ready():
				attempt-- // the edge cannot serve yet: wait for it
				if !j.waitReady(ctx) {
					return
				}
				wait = 0
			case resp.RetryAfter > 0:
				attempt-- // the refusal says when it will fit
				wait, quota = resp.RetryAfter, quotaRefusal(resp)
			case attempt >= s.cfg.MaxAttempts:
			default:
				delay = min(2*delay, 16*s.cfg.RetryDelay)
			}
			if attempt >= s.cfg.MaxAttempts {
				break
			}
			if wait > 0 {
				if quota {
					// The line waits for its key's window: no rate holds.
					j.quotaWait(1, s.cfg.Now().Add(wait))
				}
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
				case <-t.C:
				}
				if quota {
					j.quotaWait(-1, time.Time{})
				}
				if ctx.Err() != nil {
					return
				}
			}
		}
	}
	if ctx.Err() != nil {
		return // cancelled or expired meanwhile: the answer may be cut short
	}
	state := LineDone
	if resp.Status < 200 || resp.Status > 299 {
		state = LineFailed
	} else {
		j.ran()
	}
	result, err := resultLine(j.kind, l.CustomID, resp)
	if err == nil {
		var ok bool
		ok, err = s.store.FinishLine(context.Background(), j.id, j.epoch, l.No, state, result)
		if ok && s.cfg.Progress != nil {
			s.cfg.Progress(j.kind, state)
		}
		if err == nil && !ok {
			s.logger.Info("batch line result discarded: recorded already, or the batch has another runner", "batch", j.id, "line", l.No)
		}
	}
	if err != nil {
		s.logger.Error("batch line result not saved", "batch", j.id, "line", l.No, "err", err)
	}
}

// quotaWait counts a line that starts (delta 1, until when its key's
// window holds it) or ends (delta −1) a wait for its key's quota. The
// batch is stored Waiting WaitingQuota when the first starts, or when a
// wait ends more than a second after the stored WaitingUntil.
func (j *job) quotaWait(delta int, until time.Time) {
	j.mu.Lock()
	j.quotaWaits += delta
	store := delta > 0 && (j.b.Waiting != WaitingQuota || until.After(j.b.WaitingUntil.Add(time.Second)))
	j.mu.Unlock()
	if store {
		j.saveWaiting(WaitingQuota, until)
	}
}

// ran notes a line answered 2xx: once no line waits for the key's quota,
// the batch is stored waiting no more.
func (j *job) ran() {
	j.mu.Lock()
	none := j.quotaWaits == 0 && j.b.Waiting != ""
	j.mu.Unlock()
	if none {
		j.saveWaiting("", time.Time{})
	}
}

// saveWaiting stores the batch's Waiting and WaitingUntil, and when a
// wait begins or ends, WaitingSince and Waited.
func (j *job) saveWaiting(reason string, until time.Time) {
	now := j.s.cfg.Now()
	if _, err := j.save(func(b *Batch) {
		switch {
		case reason != "" && b.Waiting == "":
			b.WaitingSince = now
		case reason == "" && b.Waiting != "":
			if !b.WaitingSince.IsZero() && now.After(b.WaitingSince) {
				b.Waited += now.Sub(b.WaitingSince)
			}
			b.WaitingSince = time.Time{}
		}
		b.Waiting, b.WaitingUntil = reason, until
	}); err != nil {
		j.s.logger.Error("batch status not saved", "batch", j.id, "err", err)
	}
}

// keyRefusals are what a 429 of the batch's key's own limits holds: the
// codes of the OpenAI shape (a quota's window, the key's requests per
// minute), and the messages of the Anthropic shape, which has no code.
var keyRefusals = [][]byte{
	[]byte(`"code":"quota_exceeded"`), []byte(`"code":"rate_limit_exceeded"`),
	[]byte(`"message":"Quota `), []byte(` requests per minute; retry later"`),
}

// quotaRefusal reports whether resp is a refusal of the batch's key's
// quota or request rate (429), not of load.
func quotaRefusal(resp Response) bool {
	if resp.Status != 429 || bytes.Contains(resp.Body, []byte(`"code":"upstream_rate_limited"`)) {
		return false
	}
	for _, k := range keyRefusals {
		if bytes.Contains(resp.Body, k) {
			return true
		}
	}
	return false
}

// waitReady waits until the edge is ready (Config.Ready), polling every
// RetryDelay; false when ctx ended first.
func (j *job) waitReady(ctx context.Context) bool {
	for j.s.cfg.Ready != nil && !j.s.cfg.Ready() {
		t := time.NewTimer(j.s.cfg.RetryDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
	return true
}

// retryable reports whether a line answered status is tried again: a
// refusal for load (429, 503), or, in a batch resumed by Start, an
// unknown model (404) within StartGrace of it, when the model's node may
// not have reconnected yet.
func (j *job) retryable(resp Response) bool {
	switch resp.Status {
	case 429, 503:
		return true
	case 502:
		// The node serving it was lost: the line never got its answer.
		return bytes.Contains(resp.Body, []byte(`"code":"upstream_unavailable"`))
	case 404:
		return !j.resumed.IsZero() && j.s.cfg.Now().Sub(j.resumed) < j.s.cfg.StartGrace
	}
	return false
}

// refusedField names the field of a line's body a batch cannot serve:
// "stream" (a batch answer is one JSON body), "background" on
// /v1/responses (its answer would go to the response store, not the
// batch's output); "" for none.
func refusedField(endpoint string, body []byte) string {
	var b struct {
		Stream     bool `json:"stream"`
		Background bool `json:"background"`
	}
	if json.Unmarshal(body, &b) != nil {
		return ""
	}
	switch {
	case b.Stream:
		return "stream"
	case b.Background && endpoint == "/v1/responses":
		return "background"
	}
	return ""
}

// fieldRefusal is the 400 answer of a line whose field a batch cannot
// serve, in the batch API's error shape.
func fieldRefusal(kind, field string) []byte {
	msg := field + ": a batch request cannot " + map[string]string{"stream": "stream", "background": "run in the background"}[field]
	if kind == KindAnthropic {
		return []byte(`{"type":"error","error":{"type":"invalid_request_error","message":"` + msg + `"}}`)
	}
	return []byte(`{"error":{"message":"` + msg + `","type":"invalid_request_error","param":"` + field + `","code":null}}`)
}

// jsonOrString is body as JSON, or as a JSON string when it is not JSON.
func jsonOrString(body []byte) json.RawMessage {
	if json.Valid(body) {
		return body
	}
	s, _ := json.Marshal(string(body))
	return s
}

// resultLine is the result of one line as its API shapes it: OpenAI's
// {id, custom_id, response:{status_code, request_id, body}, error};
// Anthropic's {custom_id, result:{type succeeded|errored, message|error}}.
func resultLine(kind, customID string, resp Response) ([]byte, error) {
	if kind == KindAnthropic {
		result := map[string]any{"type": "succeeded", "message": jsonOrString(resp.Body)}
		if resp.Status < 200 || resp.Status > 299 {
			result = map[string]any{"type": "errored", "error": jsonOrString(resp.Body)}
		}
		return json.Marshal(map[string]any{"custom_id": customID, "result": result})
	}
	return json.Marshal(map[string]any{
		"id": newID("batch_req_"), "custom_id": customID,
		"response": map[string]any{"status_code": resp.Status, "request_id": resp.RequestID, "body": jsonOrString(resp.Body)},
		"error":    nil,
	})
}

// unrunLine is the result of a line that never ran: OpenAI's error-file
// line for an expired batch, Anthropic's canceled or expired result.
func unrunLine(kind, customID, final string) []byte {
	var out []byte
	if kind == KindAnthropic {
		typ := "canceled"
		if final == StatusExpired {
			typ = "expired"
		}
		out, _ = json.Marshal(map[string]any{"custom_id": customID, "result": map[string]string{"type": typ}})
		return out
	}
	out, _ = json.Marshal(map[string]any{
		"id": newID("batch_req_"), "custom_id": customID, "response": nil,
		"error": map[string]string{"code": "batch_expired", "message": "This request could not be executed before the completion window expired."},
	})
	return out
}

// finalize writes the batch's result files from its stored lines and
// ends it as final (completed, expired or cancelled; a cancelling batch
// always ends cancelled).
func (j *job) finalize(ctx context.Context, final string) error {
	if ok, err := j.save(func(b *Batch) { b.Status, b.FinalizingAt = StatusFinalizing, j.s.cfg.Now() }); err != nil {
		return err
	} else if !ok {
		final = StatusCancelled
	}
	j.mu.Lock()
	b := j.b
	j.mu.Unlock()
	var files []File
	var unrun int
	write := func(name string, keep func(l Line) []byte) (string, error) {
		f := File{ID: newID("file-"), Owner: b.Owner, Purpose: "batch_output", Filename: b.ID + "_" + name + ".jsonl", CreatedAt: j.s.cfg.Now()}
		lines := 0
		n, err := j.s.writeFileWith(ctx, f.ID, func(w io.Writer) error {
			return j.s.store.Results(ctx, b.ID, func(l Line) error {
				if out := keep(l); out != nil {
					lines++
					if _, err := w.Write(append(out, '\n')); err != nil {
						return err
					}
				}
				return nil
			})
		})
		if err != nil || lines == 0 {
			j.s.removeContent(f.ID)
			return "", err
		}
		f.Bytes = n
		files = append(files, f)
		return f.ID, j.s.store.CreateFile(ctx, f)
	}
	var err error
	if b.Kind == KindAnthropic {
		b.ResultsFileID, err = write("results", func(l Line) []byte {
			if l.State == LinePending {
				unrun++
				return unrunLine(b.Kind, l.CustomID, final)
			}
			return l.Result
		})
	} else {
		if b.OutputFileID, err = write("output", func(l Line) []byte {
			if l.State == LineDone {
				return l.Result
			}
			return nil
		}); err == nil {
			b.ErrorFileID, err = write("error", func(l Line) []byte {
				switch {
				case l.State == LineFailed:
					return l.Result
				case l.State == LinePending && final == StatusExpired:
					return unrunLine(b.Kind, l.CustomID, final)
				}
				return nil
			})
		}
	}
	if err != nil {
		return err
	}
	now := j.s.cfg.Now()
	_, err = j.save(func(nb *Batch) {
		nb.Status, nb.OutputFileID, nb.ErrorFileID, nb.ResultsFileID = final, b.OutputFileID, b.ErrorFileID, b.ResultsFileID
		switch final {
		case StatusCompleted:
			nb.CompletedAt = now
		case StatusExpired:
			nb.ExpiredAt, nb.ExpiredCount = now, unrun
		case StatusCancelled:
			nb.CancelledAt, nb.Canceled = now, unrun
		}
	})
	return err
}

// writeFileWith writes file id's bytes with fn, whole or not at all.
func (s *Service) writeFileWith(ctx context.Context, id string, fn func(w io.Writer) error) (int64, error) {
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		bw := bufio.NewWriterSize(pw, 64<<10)
		err := fn(bw)
		if err == nil {
			err = bw.Flush()
		}
		pw.CloseWithError(err)
	}()
	n, err := s.contents.Put(ctx, id, pr)
	pr.CloseWithError(io.ErrClosedPipe) // unblocks fn if the write failed
	<-done
	return n, err
}
