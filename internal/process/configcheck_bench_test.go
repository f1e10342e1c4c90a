package process

import (
	"fmt"
	"strings"
	"testing"
)

// aliasesConfig is an edge config with n aliases of two targets each.
func aliasesConfig(n int) []byte {
	var b strings.Builder
	b.WriteString("models:\n")
	for i := range n {
		fmt.Fprintf(&b, "  alias%d:\n    targets: [m%d, \"m%d:7b\"]\n", i, i, i)
	}
	return []byte(b.String())
}

// BenchmarkCheckConfigAliases is iop check on an edge config of many
// aliases; its cost per alias should not grow with their number.
func BenchmarkCheckConfigAliases(b *testing.B) {
	k, err := ConfigKind(KindEdge)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1000, 10000, 40000} {
		data := aliasesConfig(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				if ps := CheckConfig(k, data); len(ps) > 0 {
					b.Fatal(ps)
				}
			}
		})
	}
}
