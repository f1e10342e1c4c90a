package batch

import (
	"context"
	"time"
)

// File is one stored file's record; its bytes live in the service's
// directory under its id.
type File struct {
	ID, Owner, Purpose, Filename string
	Bytes                        int64
	CreatedAt                    time.Time
}

// Kinds of batch: which API created it and so how its results read.
const (
	KindOpenAI    = "openai"
	KindAnthropic = "anthropic"
)

// Statuses of a batch (OpenAI's names; Anthropic's processing_status is
// derived from them).
const (
	StatusValidating = "validating"
	StatusFailed     = "failed"
	StatusInProgress = "in_progress"
	StatusFinalizing = "finalizing"
	StatusCompleted  = "completed"
	StatusExpired    = "expired"
	StatusCancelling = "cancelling"
	StatusCancelled  = "cancelled"
)

// Batch is one batch's record.
type Batch struct {
	ID, Owner, Kind            string
	Endpoint, InputFileID      string
	CompletionWindow           string
	Metadata                   map[string]string
	Status                     string
	Errors                     []LineError // why validation failed
	OutputFileID, ErrorFileID  string
	Total, Completed, Failed   int
	CreatedAt, ExpiresAt       time.Time
	InProgressAt, FinalizingAt time.Time
	CompletedAt, FailedAt      time.Time
	ExpiredAt, CancellingAt    time.Time
	CancelledAt                time.Time
	ResultsFileID              string // Anthropic: every result, in line order
	Canceled, ExpiredCount     int    // Anthropic: lines ended unrun
	// Waiting says why the batch's lines do not run though it is in
	// progress: WaitingQuota while its key's quota refuses them, "" when
	// they run. WaitingUntil is when the latest refusal said the quota
	// holds a line again (its Retry-After).
	Waiting      string
	WaitingUntil time.Time
	// WaitingSince is when the present wait began (zero while the lines
	// run); Waited is the time the batch's earlier waits took, so that
	// its rate counts the time its lines could run (the progress's ETA).
	WaitingSince time.Time
	Waited       time.Duration

	// Runner names the service that holds (or last held) the batch's
	// lease; Leased says whether its lease is live (ActiveBatches).
	Runner string
	Leased bool
	// Epoch is the lease's fencing number: it grows with every Claim, and
	// the writes of a runner (UpdateBatch, FinishLine) carry the epoch
	// it claimed; one of an older epoch is refused.
	Epoch int64
}

// active reports whether the batch still has work: a job runs for it.
func (b Batch) active() bool {
	switch b.Status {
	case StatusValidating, StatusInProgress, StatusFinalizing, StatusCancelling:
		return true
	}
	return false
}

// LineError is one validation error of an input file (OpenAI's
// errors.data[]): Line is 1-based, 0 for the file as a whole.
type LineError struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int    `json:"line"`
}

// WaitingQuota is Batch.Waiting while the batch's key's quota refuses
// its lines (429 quota_exceeded with a Retry-After).
const WaitingQuota = "quota"

// Line is one request of a batch. State is pending until its result is
// recorded (done or failed), exactly once.
type Line struct {
	No       int
	CustomID string
	Body     []byte
	State    string
	Result   []byte
}

// Line states.
const (
	LinePending = "pending"
	LineDone    = "done"
	LineFailed  = "failed"
)

// Store persists files, batches and their lines, for one edge (SQLite)
// or several sharing one database (PostgreSQL). A batch's lines run on
// the service holding its lease (Claim); a line's result is recorded
// once, and only by the lease's current epoch.
type Store interface {
	CreateFile(ctx context.Context, f File) error
	// GetFile returns owner's file id, or ErrNotFound.
	GetFile(ctx context.Context, owner, id string) (File, error)
	// ListFiles returns up to limit of owner's files (of purpose, unless
	// ""), newest first, created before the file after (unless "").
	ListFiles(ctx context.Context, owner, purpose, after string, limit int) ([]File, bool, error)
	DeleteFile(ctx context.Context, owner, id string) error

	// CreateBatch stores b, with no lease.
	CreateBatch(ctx context.Context, b Batch) error
	GetBatch(ctx context.Context, owner, id string) (Batch, error)
	ListBatches(ctx context.Context, owner, kind, after string, limit int) ([]Batch, bool, error)
	// UpdateBatch saves b's status, times, errors and file ids as the
	// runner of lease b.Epoch. Errors: ErrLeaseLost when another claim
	// took the lease; ErrState when the stored batch is cancelling (a
	// cancel from any edge) and b's status is not cancelled.
	UpdateBatch(ctx context.Context, b Batch) error
	// ActiveBatches lists every batch still being worked on (validating,
	// in_progress, finalizing, cancelling), oldest first, with Runner and
	// Leased.
	ActiveBatches(ctx context.Context) ([]Batch, error)
	// CountBatches counts the batches of every owner by status.
	CountBatches(ctx context.Context) (map[string]int, error)
	// RequestCancel moves owner's batch id from validating or
	// in_progress to cancelling at at, whichever service runs it (its
	// runner sees it at its next Renew). A batch already cancelling is
	// returned unchanged; one in another status is ErrState.
	RequestCancel(ctx context.Context, owner, id string, at time.Time) (Batch, error)
	// DropLines deletes batch id's lines and sets its total to 0: a batch
	// whose input failed validation runs none of them.
	DropLines(ctx context.Context, id string) error
	// DeleteBatch deletes owner's ended batch id (completed, failed,
	// expired, cancelled) and its lines, in one transaction. Errors:
	// ErrNotFound, ErrState for a batch still being worked on.
	DeleteBatch(ctx context.Context, owner, id string) error

	// Claim gives runner the lease of active batch id for ttl, when no
	// other runner's lease is live, with a new, higher epoch; it returns
	// the stored batch (Epoch set) and true, or false when another runner
	// holds it or the batch ended. The lease's clock is the database's.
	Claim(ctx context.Context, id, runner string, ttl time.Duration) (Batch, bool, error)
	// Renew extends the lease of epoch by ttl and returns the stored
	// status; false when a later claim took the lease.
	Renew(ctx context.Context, id string, epoch int64, ttl time.Duration) (string, bool, error)
	// Release ends the lease of epoch at once, so any runner may claim
	// the batch (a service closing, or a batch that ended).
	Release(ctx context.Context, id string, epoch int64) error

	// AddLines inserts lines of batch id (a line already stored stays as
	// it is) and sets its total to its lines' count, in one transaction.
	AddLines(ctx context.Context, id string, lines []Line) error
	// PendingLines returns batch id's lines without a result, in order.
	PendingLines(ctx context.Context, id string) ([]Line, error)
	// FinishLine records the result of a pending line, as the runner of
	// lease epoch, and counts it in the batch (completed or failed); it
	// reports false, changing nothing, when the line already has one or
	// the lease has a later epoch (a late answer of a line another runner
	// runs again).
	FinishLine(ctx context.Context, id string, epoch int64, no int, state string, result []byte) (bool, error)
	// Results calls fn for each line of batch id, in order.
	Results(ctx context.Context, id string, fn func(Line) error) error
	Close() error
}

// batchDoc is the part of a Batch kept as one JSON document.
type batchDoc struct {
	Endpoint         string            `json:"endpoint"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	Errors           []LineError       `json:"errors,omitempty"`
	OutputFileID     string            `json:"output_file_id,omitempty"`
	ErrorFileID      string            `json:"error_file_id,omitempty"`
	ResultsFileID    string            `json:"results_file_id,omitempty"`
	Canceled         int               `json:"canceled,omitempty"`
	Expired          int               `json:"expired,omitempty"`
	Times            map[string]int64  `json:"times"`              // Unix seconds
	TimesNS          map[string]int64  `json:"times_ns,omitempty"` // the same, Unix nanoseconds (a resumed batch's expiry is exact)
	Waiting          string            `json:"waiting,omitempty"`
	WaitingUntilNS   int64             `json:"waiting_until_ns,omitempty"`
	WaitingSinceNS   int64             `json:"waiting_since_ns,omitempty"`
	WaitedNS         int64             `json:"waited_ns,omitempty"`
}

func docOf(b Batch) batchDoc {
	d := batchDoc{Endpoint: b.Endpoint, InputFileID: b.InputFileID, CompletionWindow: b.CompletionWindow,
		Metadata: b.Metadata, Errors: b.Errors, OutputFileID: b.OutputFileID, ErrorFileID: b.ErrorFileID,
		ResultsFileID: b.ResultsFileID, Canceled: b.Canceled, Expired: b.ExpiredCount, Times: map[string]int64{}, TimesNS: map[string]int64{},
		Waiting: b.Waiting, WaitedNS: int64(b.Waited)}
	if b.Waiting != "" && !b.WaitingUntil.IsZero() {
		d.WaitingUntilNS = b.WaitingUntil.UnixNano()
	}
	if b.Waiting != "" && !b.WaitingSince.IsZero() {
		d.WaitingSinceNS = b.WaitingSince.UnixNano()
	}
	for name, t := range b.times() {
		if !t.IsZero() {
			d.Times[name], d.TimesNS[name] = t.Unix(), t.UnixNano()
		}
	}
	return d
}

func (d batchDoc) into(b *Batch) {
	b.Endpoint, b.InputFileID, b.CompletionWindow = d.Endpoint, d.InputFileID, d.CompletionWindow
	b.Metadata, b.Errors, b.OutputFileID, b.ErrorFileID = d.Metadata, d.Errors, d.OutputFileID, d.ErrorFileID
	b.ResultsFileID, b.Canceled, b.ExpiredCount = d.ResultsFileID, d.Canceled, d.Expired
	b.Waiting, b.Waited = d.Waiting, time.Duration(d.WaitedNS)
	if d.WaitingUntilNS != 0 {
		b.WaitingUntil = time.Unix(0, d.WaitingUntilNS)
	}
	if d.WaitingSinceNS != 0 {
		b.WaitingSince = time.Unix(0, d.WaitingSinceNS)
	}
	for name, p := range b.times() {
		if ns, ok := d.TimesNS[name]; ok {
			*p = time.Unix(0, ns)
		} else if s, ok := d.Times[name]; ok {
			*p = time.Unix(s, 0)
		}
	}
}

// times names the batch's time fields (pointers into b).
func (b *Batch) times() map[string]*time.Time {
	return map[string]*time.Time{
		"created_at": &b.CreatedAt, "expires_at": &b.ExpiresAt, "in_progress_at": &b.InProgressAt,
		"finalizing_at": &b.FinalizingAt, "completed_at": &b.CompletedAt, "failed_at": &b.FailedAt,
		"expired_at": &b.ExpiredAt, "cancelling_at": &b.CancellingAt, "cancelled_at": &b.CancelledAt,
	}
}
