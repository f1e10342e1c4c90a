package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"iop/internal/benchrun"
	"iop/internal/e2e/harness"
	"iop/internal/ollamatest"
)

// TestRealOllamaResidencyBench is `iop bench --residency` on the real
// Ollama pair: two `ollama serve`, each holding one model at a time
// (OLLAMA_MAX_LOADED_MODELS=1) and answering two requests at a time
// (OLLAMA_NUM_PARALLEL=2), of three tiny models, behind iop edge and node
// processes; the same trace with residency on and off; loads counted from
// the Ollamas' logs. It reports figures (BENCHMARKS.md, its model residency section),
// asserts no target, and runs only with IOP_BENCH_REAL_OLLAMA=1 (minutes);
// IOP_BENCH_REAL_OLLAMA_MAX_LOADED=2 has each Ollama hold two models.
func TestRealOllamaResidencyBench(t *testing.T) {
	if os.Getenv("IOP_BENCH_REAL_OLLAMA") != "1" {
		t.Skip("a benchmark: set IOP_BENCH_REAL_OLLAMA=1 to run it")
	}
	const models = 3
	maxLoaded := 1
	if os.Getenv("IOP_BENCH_REAL_OLLAMA_MAX_LOADED") == "2" {
		maxLoaded = 2
	}
	var urls []string
	var ollamas []*ollamatest.Server
	for range 2 {
		s := ollamatest.Start(t, fmt.Sprintf("OLLAMA_MAX_LOADED_MODELS=%d", maxLoaded), "OLLAMA_NUM_PARALLEL=2")
		for i := range models {
			s.CreateModel(t, fmt.Sprintf("m%d", i+1), ollamatest.Plain)
		}
		ollamas = append(ollamas, s)
		urls = append(urls, s.URL)
	}
	var out strings.Builder
	rep, err := benchrun.Residency(t.Context(), benchrun.ResidencyConfig{
		Binary: harness.IOP(t), Models: models, MaxLoaded: maxLoaded, Capacity: 2, Rate: 2, Duration: 60 * time.Second,
		LoadTime: time.Second, Ollamas: urls, Log: &out,
		CountLoads: func() int64 {
			n := 0
			for _, s := range ollamas {
				n += runnerStarts(s, 0)
			}
			return int64(n)
		},
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	rep.WriteTable(&out)
	t.Log("\n" + out.String())
}
