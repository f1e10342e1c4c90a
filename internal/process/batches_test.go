package process

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// TestRegression_StoppedEdgesBatchFilesRemoved: an edge whose database is
// in memory keeps batch uploads in a temporary directory it removes when
// it stops; one killed left it behind (uploads of up to 32 MiB each, for
// ever). An edge that starts now removes the directories of edges whose
// process is gone, and only those.
func TestRegression_StoppedEdgesBatchFilesRemoved(t *testing.T) {
	t.Parallel()
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead, alive := strconv.Itoa(gone.Process.Pid), strconv.Itoa(os.Getpid())
	dir := t.TempDir()
	for _, name := range []string{batchDirPrefix + dead + "-123", batchDirPrefix + alive + "-456", batchDirPrefix + "789", "other-" + dead + "-1"} {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "file-x"), []byte("upload"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removeOrphanBatchDirs(dir, slog.New(slog.DiscardHandler))
	for name, kept := range map[string]bool{
		batchDirPrefix + dead + "-123":  false, // its edge is gone
		batchDirPrefix + alive + "-456": true,  // a running edge's
		batchDirPrefix + "789":          true,  // no process id in its name
		"other-" + dead + "-1":          true,  // not a batch directory
	} {
		_, err := os.Stat(filepath.Join(dir, name))
		if got := err == nil; got != kept {
			t.Errorf("%s: kept %v, want %v (%v)", name, got, kept, err)
		}
	}
}
