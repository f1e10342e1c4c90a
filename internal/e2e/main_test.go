package e2e

import (
	"testing"

	"iop/internal/e2e/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }
