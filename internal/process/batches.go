package process

import (
	"context"
	"errors"
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
	tmpDir string // removed at close; "" when the files live beside the database
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
		if dir, err = os.MkdirTemp("", batchDirPrefix+strconv.Itoa(os.Getpid())+"-"); err != nil {
			b.store.Close()
			return err
		}
		b.tmpDir = dir
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
// database is in memory keeps batch files in, followed by its process id
// and a dash.
const batchDirPrefix = "iop-batch-files-"

// removeOrphanBatchDirs removes the batch file directories under dir of
// edges that are gone (killed before they could remove their own): those
// whose process id names no running process. A directory of a running
// process, or without a process id in its name, stays.
func removeOrphanBatchDirs(dir string, logger *slog.Logger) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), batchDirPrefix)
		pidText, _, dashed := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || !dashed || err != nil || pid <= 0 || !e.IsDir() || processAlive(pid) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			logger.Warn("cannot remove a stopped edge's batch files", "dir", e.Name(), "err", err)
			continue
		}
		logger.Info("removed a stopped edge's batch files", "dir", e.Name(), "pid", pid)
	}
}

// processAlive reports whether pid names a running process (signal 0
// reaches it, or it exists but is not ours to signal).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
