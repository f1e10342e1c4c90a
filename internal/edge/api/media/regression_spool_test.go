package media

import (
	"bytes"
	"io"
	"testing"
)

// TestRegression_PausedUploadsHoldABoundedTotal: 150 uploads that each
// sent ~1 MiB before their model field and paused held 150 MiB of spools
// in memory. Their spools now share a budget (maxHeldTotal; 4 MiB here
// to keep the test small): the ones past it go to
// their temporary files, each relays its bytes unchanged, and closing them
// all lets go of every byte.
func TestRegression_PausedUploadsHoldABoundedTotal(t *testing.T) {
	t.Parallel()
	held := &memBudget{max: 4 << 20}
	dir := t.TempDir()
	prefix := bytes.Repeat([]byte("0123456789abcdef"), maxHeldPrefix/16-64)
	const uploads = 12
	spools := make([]*spool, uploads)
	inFile := 0
	for i := range spools {
		sp := &spool{dir: dir, held: held}
		spools[i] = sp
		for p := prefix; len(p) > 0; {
			n := min(len(p), 32<<10)
			if _, err := sp.Write(p[:n]); err != nil {
				t.Fatalf("upload %d: %v", i, err)
			}
			p = p[n:]
			if h := held.n.Load(); h > held.max {
				t.Fatalf("upload %d: the spools hold %d bytes in memory, over %d", i, h, held.max)
			}
		}
		if sp.file != nil {
			inFile++
		}
	}
	if want := uploads - int(held.max)/len(prefix); inFile < want {
		t.Fatalf("%d of %d spools in files, want at least %d", inFile, uploads, want)
	}
	for i, sp := range spools {
		got, err := io.ReadAll(sp.reader(0, "", ""))
		if err != nil || !bytes.Equal(got, prefix) {
			t.Fatalf("upload %d relays %d bytes (%v), want its %d", i, len(got), err, len(prefix))
		}
	}
	for _, sp := range spools {
		sp.close()
	}
	if h := held.n.Load(); h != 0 {
		t.Fatalf("after every upload ended the spools hold %d bytes", h)
	}
}
