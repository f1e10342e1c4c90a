package process

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStartUnknownMode: Start refuses a mode it does not know, naming it.
func TestStartUnknownMode(t *testing.T) {
	t.Parallel()
	if _, err := Start(context.Background(), Config{Mode: "proxy"}, Deps{}); err == nil || !strings.Contains(err.Error(), `"proxy"`) {
		t.Fatalf("mode proxy: %v, want an error naming it", err)
	}
}
