package process

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"iop/internal/batch"
	batchapi "iop/internal/edge/api/batch"
)

// edgeBatches is the edge's files and batches: their store, service and
// the counter of finished lines.
type edgeBatches struct {
	store  *batch.SQL
	svc    *batch.Service
	tmpDir string   // removed at close; "" when the files live beside the database
	owner  *os.File // tmpDir's owner lock (ownBatchDir), held until close
}

// openBatches opens the batch tables: in PostgreSQL with cfg.RunsDSN,
// shared by the edges on it (each batch runs on the edge holding its
// lease) with the files' bytes; else in cfg.Database, the files'
// directory beside it (cfg.Database + ".files"; a temporary one for an
// in-memory database). The runner starts with the HTTP API (serve).
func (e *edgeProcess) openBatches(ctx context.Context) error {
	b := &edgeBatches{}
	var err error
	var contents batch.Contents
	dir := e.cfg.Database + ".files"
	if e.cfg.RunsDSN != "" {
		if b.store, err = batch.OpenPostgres(ctx, e.cfg.RunsDSN); err != nil {
			return err
		}
		contents, dir = b.store, ""
	} else if b.store, err = batch.OpenSQLite(e.cfg.Database); err != nil {
		return err
	}
	if contents == nil && (e.cfg.Database == ":memory:" || e.cfg.Database == "") {
		removeOrphanBatchDirs(os.TempDir(), e.logger)
		if b.tmpDir, b.owner, err = newBatchDir(os.TempDir()); err != nil {
			b.store.Close()
			return err
		}
		dir = b.tmpDir
	}
	lines := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "iop_batch_lines_total",
		Help: "Batch lines finished, by API (openai, anthropic) and state (done, failed).",
	}, []string{"api", "state"})
	if err := e.obs.registry.Register(lines); err != nil {
		b.close()
		return err
	}
	if err := e.obs.registry.Register(batchCounts{b}); err != nil {
		b.close()
		return err
	}
	maxFile := e.cfg.MaxBodyBytes // an upload is a request body: the edge's body limit bounds it
	if maxFile <= 0 {
		maxFile = batch.DefaultMaxFileBytes
	}
	b.svc, err = batch.New(batch.Config{Store: b.store, Contents: contents, Dir: dir, MaxFileBytes: maxFile, Runner: e.edgeName(),
		Ready: e.Service.Ready, Logger: e.logger, Progress: func(kind, state string) { lines.WithLabelValues(kind, state).Inc() }})
	if err != nil {
		b.close()
		return err
	}
	e.batches = b
	return nil
}

// start starts the runner, executing lines through handler.
func (e *edgeProcess) startBatches(ctx context.Context, handler http.Handler) error {
	return e.batches.svc.Start(ctx, &batchapi.Executor{Handler: handler, Keys: e.Keys})
}

// stopRunner stops the batch runner (idempotent): lines in flight stay
// pending and run again after a restart.
func (b *edgeBatches) stopRunner() {
	if b != nil && b.svc != nil {
		b.svc.Close()
	}
}

func (b *edgeBatches) close() error {
	b.stopRunner()
	err := b.store.Close()
	if b.tmpDir != "" {
		os.RemoveAll(b.tmpDir)
		b.owner.Close()
	}
	return err
}

// closeBatches stops the runner and closes the store.
func (e *edgeProcess) closeBatches(context.Context) error { return e.batches.close() }

// edgeName is this edge's name among edges sharing a database: cfg.Name,
// else the cluster's name for it, else the host name ("" without one).
func (e *edgeProcess) edgeName() string {
	if e.cfg.Name != "" {
		return e.cfg.Name
	}
	if e.cfg.Cluster != nil && e.cfg.Cluster.Name != "" {
		return e.cfg.Cluster.Name
	}
	name, _ := os.Hostname()
	return name
}

// batchesDesc is the gauge of batches by status.
var batchesDesc = prometheus.NewDesc("iop_batches", "Batches by status (validating, in_progress, finalizing, completed, failed, expired, cancelling, cancelled), "+
	"of every key; edges sharing a PostgreSQL database each report the same.", []string{"status"}, nil)

// batchCounts collects iop_batches from the store at each scrape.
type batchCounts struct{ b *edgeBatches }

func (c batchCounts) Describe(ch chan<- *prometheus.Desc) { ch <- batchesDesc }

func (c batchCounts) Collect(ch chan<- prometheus.Metric) {
	if c.b.svc == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	counts, err := c.b.svc.Counts(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(batchesDesc, err)
		return
	}
	for status, n := range counts {
		ch <- prometheus.MustNewConstMetric(batchesDesc, prometheus.GaugeValue, float64(n), status)
	}
}

// batchDirPrefix starts the name of the temporary directory an edge whose
// database is in memory keeps batch files in (its process id, a dash and
// a random suffix follow, for people; the owner lock decides).
const batchDirPrefix = "iop-batch-files-"

// ownerLockName is the file in a batch file directory its edge holds an
// exclusive flock(2) on for its life: the kernel lets it go when the
// process ends, however it ends, and the lock is seen from every process
// on the host, whatever its pid namespace.
const ownerLockName = ".owner"

// newBatchDir makes a batch file directory under parent and takes its
// owner lock: made under a name the sweep (removeOrphanBatchDirs) skips,
// locked, then renamed, so no sweep sees it unlocked.
func newBatchDir(parent string) (string, *os.File, error) {
	const staging = ".iop-batch-new-"
	tmp, err := os.MkdirTemp(parent, staging)
	if err != nil {
		return "", nil, err
	}
	owner, err := ownBatchDir(tmp)
	if err != nil {
		os.RemoveAll(tmp)
		return "", nil, err
	}
	dir := filepath.Join(parent, batchDirPrefix+strconv.Itoa(os.Getpid())+"-"+strings.TrimPrefix(filepath.Base(tmp), staging))
	if err := os.Rename(tmp, dir); err != nil {
		owner.Close()
		os.RemoveAll(tmp)
		return "", nil, err
	}
	return dir, owner, nil
}

// ownBatchDir takes dir's owner lock; closing the file lets it go.
func ownBatchDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, ownerLockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("batch files %s: owner lock: %w", dir, err)
	}
	return f, nil
}

// removeOrphanBatchDirs removes the batch file directories under dir of
// edges that are gone (killed before they could remove their own): those
// whose owner lock nobody holds. A directory whose lock is held (a running
// edge, in any pid namespace), or without a lock file (an edge creating
// it, or an older edge's), stays.
func removeOrphanBatchDirs(dir string, logger *slog.Logger) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), batchDirPrefix) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		lock, err := os.OpenFile(filepath.Join(path, ownerLockName), os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			lock.Close() // its edge runs
			continue
		}
		err = os.RemoveAll(path)
		lock.Close()
		if err != nil {
			logger.Warn("cannot remove a stopped edge's batch files", "dir", path, "err", err)
			continue
		}
		logger.Info("removed a stopped edge's batch files", "dir", path)
	}
}
