package modelname

import "testing"

func TestNameRule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, key, alt string
		tagged         bool
	}{
		{"tiny", "tiny:latest", "tiny:latest", false},
		{"tiny:latest", "tiny:latest", "tiny", true},
		{"tiny:7b", "tiny:7b", "", true},
		{"ns/tiny", "ns/tiny:latest", "ns/tiny:latest", false},
		{"ns/tiny:latest", "ns/tiny:latest", "ns/tiny", true},
		{"host:5000/ns/tiny", "host:5000/ns/tiny:latest", "host:5000/ns/tiny:latest", false},
		{"host:5000/ns/tiny:tag", "host:5000/ns/tiny:tag", "", true},
		{"host:5000/ns/tiny:latest", "host:5000/ns/tiny:latest", "host:5000/ns/tiny", true},
		{"meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct:latest", "meta-llama/Llama-3.1-8B-Instruct:latest", false},
		{"", "", "", false},
		{":latest", ":latest", "", true},
		{"ns/:latest", "ns/:latest", "", true},
	}
	for _, tc := range tests {
		if got := Tagged(tc.name); got != tc.tagged {
			t.Errorf("Tagged(%q) = %v, want %v", tc.name, got, tc.tagged)
		}
		if got := Key(tc.name); got != tc.key {
			t.Errorf("Key(%q) = %q, want %q", tc.name, got, tc.key)
		}
		if got := Alternative(tc.name); got != tc.alt {
			t.Errorf("Alternative(%q) = %q, want %q", tc.name, got, tc.alt)
		}
		if tc.alt != "" && !Same(tc.name, tc.alt) {
			t.Errorf("Same(%q, %q) = false, want true", tc.name, tc.alt)
		}
	}
	same := []struct {
		a, b string
		want bool
	}{
		{"tiny", "tiny:latest", true},
		{"tiny", "tiny", true},
		{"tiny", "tiny:7b", false},
		{"tiny:latest", "tiny:7b", false},
		{"tiny", "ns/tiny", false},
		{"ns/tiny", "ns/tiny:latest", true},
		{"host:5000/ns/tiny", "host:5000/ns/tiny:latest", true},
		{"host:5000/ns/tiny:tag", "host:5000/ns/tiny", false},
		{"host:5000/ns/tiny:tag", "host:5000/ns/tiny:tag", true},
	}
	for _, tc := range same {
		if got := Same(tc.a, tc.b); got != tc.want {
			t.Errorf("Same(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := Same(tc.b, tc.a); got != tc.want {
			t.Errorf("Same(%q, %q) = %v, want %v", tc.b, tc.a, got, tc.want)
		}
	}
}
