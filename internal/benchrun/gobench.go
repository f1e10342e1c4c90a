package benchrun

import (
	"bufio"
	"io"
	"slices"
	"strconv"
	"strings"
)

// GoBenchmark is one benchmark of `go test -bench` output: the median of
// each of its metrics over the runs listed (-count).
type GoBenchmark struct {
	// Name is the benchmark's name without its -GOMAXPROCS suffix, e.g.
	// "BenchmarkAdmitRelease/waiters=10".
	Name string `json:"name"`
	// Runs is the number of result lines read.
	Runs int `json:"runs"`
	// Metrics maps a unit ("ns/op", "B/op", "B/waiter") to the median value.
	Metrics map[string]float64 `json:"metrics"`
}

// ParseGoBench reads `go test -bench` output (the format of
// golang.org/design/14313-benchmark-format: "BenchmarkName-P N value unit
// [value unit...]"), skipping every other line, and returns the
// benchmarks in the order they first appear.
func ParseGoBench(r io.Reader) ([]GoBenchmark, error) {
	type acc struct {
		runs    int
		metrics map[string][]float64
	}
	var order []string
	byName := map[string]*acc{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue // not a result line (e.g. a log line starting with the name)
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		a := byName[name]
		if a == nil {
			a = &acc{metrics: map[string][]float64{}}
			byName[name] = a
			order = append(order, name)
		}
		a.runs++
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				a.metrics[f[i+1]] = append(a.metrics[f[i+1]], v)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	out := make([]GoBenchmark, 0, len(order))
	for _, name := range order {
		a := byName[name]
		b := GoBenchmark{Name: name, Runs: a.runs, Metrics: map[string]float64{}}
		for unit, vs := range a.metrics {
			b.Metrics[unit] = median(vs)
		}
		out = append(out, b)
	}
	return out, nil
}

func median(vs []float64) float64 {
	vs = slices.Clone(vs)
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}

// goBench returns the named benchmark's median of unit, if present.
func (r Report) goBench(name, unit string) (float64, bool) {
	for _, b := range r.GoBench {
		if b.Name == name {
			v, ok := b.Metrics[unit]
			return v, ok
		}
	}
	return 0, false
}
