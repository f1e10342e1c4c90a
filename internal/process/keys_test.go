package process

import (
	"errors"
	"testing"

	"iop/internal/auth"
)

// TestRegression_ReloadEmptyingKeysNeedsInsecureOpen: a config with no
// client keys or no admin keys is refused while the running one has some,
// unless it sets insecure_open.
func TestRegression_ReloadEmptyingKeysNeedsInsecureOpen(t *testing.T) {
	t.Parallel()
	key := []auth.Key{{Name: "a"}}
	for _, c := range []struct {
		name                  string
		running, runningAdmin int
		cfg                   AccessConfig
		refused               bool
	}{
		{"client keys emptied", 1, 0, AccessConfig{}, true},
		{"admin keys emptied", 0, 1, AccessConfig{Keys: key}, true},
		{"both emptied, insecure_open", 1, 1, AccessConfig{InsecureOpen: true}, false},
		{"none running", 0, 0, AccessConfig{}, false},
		{"keys kept", 1, 1, AccessConfig{Keys: key, AdminKeys: key}, false},
	} {
		err := checkKeysKept(c.running, c.runningAdmin, c.cfg)
		if got := errors.Is(err, ErrKeysEmptied); got != c.refused {
			t.Errorf("%s: %v, want refused %v", c.name, err, c.refused)
		}
	}
}

// TestIsLoopback: the addresses an edge without client keys may serve on.
func TestIsLoopback(t *testing.T) {
	t.Parallel()
	if !isLoopback("127.0.0.1:8080") || !isLoopback("[::1]:80") || !isLoopback("localhost:1") ||
		isLoopback(":8080") || isLoopback("0.0.0.0:1") || isLoopback("[::]:1") || isLoopback("gateway:80") {
		t.Error("isLoopback")
	}
}
