package harness

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"iop/internal/testenv"
)

// TestSlotQueueServesLongTestsFirst: with its one slot taken, a queue
// hands each freed slot to the waiting long tests in arrival order, then
// to the others in arrival order, and never to more than one at a time.
func TestSlotQueueServesLongTestsFirst(t *testing.T) {
	Parallel(t)
	q := &slotQueue{limit: 1}
	q.acquire(false)
	var (
		mu     sync.Mutex
		order  []string
		inside int
		wg     sync.WaitGroup
	)
	arrive := []struct {
		name string
		long bool
	}{{"other-1", false}, {"long-1", true}, {"other-2", false}, {"long-2", true}}
	for i, a := range arrive {
		wg.Go(func() {
			q.acquire(a.long)
			mu.Lock()
			inside++
			if inside > 1 {
				t.Errorf("%s got a slot while %d others held one", a.name, inside-1)
			}
			order = append(order, a.name)
			inside--
			mu.Unlock()
			q.release()
		})
		// Each waits before the next arrives.
		testenv.Eventually(t, fmt.Sprintf("%d waiting", i+1), func() bool {
			q.mu.Lock()
			defer q.mu.Unlock()
			return len(q.long)+len(q.other) == i+1
		})
	}
	q.release()
	wg.Wait()
	if want := []string{"long-1", "long-2", "other-1", "other-2"}; !slices.Equal(order, want) {
		t.Fatalf("served %v, want %v", order, want)
	}
	if q.busy != 0 {
		t.Fatalf("%d slots still busy", q.busy)
	}
}
