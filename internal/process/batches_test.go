package process

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

// TestRegression_StoppedEdgesBatchFilesRemoved: an edge whose database is
// in memory keeps batch uploads in a temporary directory it removes when
// it stops; one killed left it behind (uploads of up to 32 MiB each, for
// ever). An edge that starts now removes the directories whose owner lock
// nobody holds, and only those: a running edge's stays, whatever its
// process id says (an edge in another pid namespace sharing /tmp removed
// the live edges' directories when the sweep went by process ids), as
// does a directory without a lock (an older edge's, or one being made).
func TestRegression_StoppedEdgesBatchFilesRemoved(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	running, runningLock, err := newBatchDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	defer runningLock.Close()
	killed, killedLock, err := newBatchDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	killedLock.Close() // the kernel lets a killed process's lock go
	older := filepath.Join(parent, batchDirPrefix+"789")
	other := filepath.Join(parent, "other-dir")
	for _, d := range []string{running, killed, older, other} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "file-x"), []byte("upload"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removeOrphanBatchDirs(parent, slog.New(slog.DiscardHandler))
	for d, kept := range map[string]bool{running: true, killed: false, older: true, other: true} {
		_, err := os.Stat(d)
		if got := err == nil; got != kept {
			t.Errorf("%s: kept %v, want %v (%v)", filepath.Base(d), got, kept, err)
		}
	}
	if _, err := ownBatchDir(running); err == nil {
		t.Errorf("the running edge's owner lock was taken by another")
	}
}
