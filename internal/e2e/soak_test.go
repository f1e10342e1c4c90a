package e2e

import (
	"context"
	"iop/internal/e2e/harness"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestSoakCommand runs `iop soak` briefly and reads its report: requests
// answered 200 and 429 (the clients outnumber capacity plus queue), the
// outcomes adding up to the requests, no slot leaked, and no goroutine
// left behind.
func TestSoakCommand(t *testing.T) {
	harness.Parallel(t)
	cmd := harness.StartCommand(t, context.Background(), "soak", "--clients", "24", "--capacity", "2", "--max-queue", "2",
		"--queue-timeout", "200ms", "--duration", "500ms", "--tokens-per-second", "500", "--max-tokens", "4")
	err := <-cmd.Done()
	report := cmd.Out.String()
	if err != nil {
		t.Fatalf("iop soak: %v\n%s\n%s", err, report, cmd.Log.String())
	}
	field := func(re string) []string {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(report)
		if m == nil {
			t.Fatalf("no %q in the report:\n%s", re, report)
		}
		return m
	}
	requests, _ := strconv.Atoi(field(`(?m)^requests +(\d+)`)[1])
	sum := 0
	for _, m := range regexp.MustCompile(`(?m)^  (\S+(?: \S+)?) +(\d+)$`).FindAllStringSubmatch(report, -1) {
		n, _ := strconv.Atoi(m[2])
		sum += n
		if strings.HasPrefix(m[1], "error") {
			t.Errorf("requests without an answer: %s", m[0])
		}
	}
	ok, _ := strconv.Atoi(field(`(?m)^  200 +(\d+)`)[1])
	full, _ := strconv.Atoi(field(`(?m)^  429 +(\d+)`)[1])
	if requests == 0 || sum != requests || ok == 0 || full == 0 {
		t.Errorf("requests %d, outcomes summing to %d (200: %d, 429: %d):\n%s", requests, sum, ok, full, report)
	}
	field(`(?m)^leaked slots  0 \(leases 0, in flight 0, queued 0\)$`)
	g := field(`(?m)^goroutines    before (\d+), after (\d+)$`)
	before, _ := strconv.Atoi(g[1])
	after, _ := strconv.Atoi(g[2])
	if after > before {
		t.Errorf("goroutines before %d, after %d", before, after)
	}
}
