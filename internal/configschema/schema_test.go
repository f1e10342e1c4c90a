package configschema

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

type testInner struct {
	Capacity int           `yaml:"capacity"`
	Timeout  time.Duration `yaml:"timeout"`
}

type testScalar struct {
	Mode string `yaml:"mode"`
	Flow string `yaml:"flow"`
}

func (s *testScalar) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		s.Mode = n.Value
		return nil
	}
	type plain testScalar
	return n.Decode((*plain)(s))
}

type testRoot struct {
	Name      string               `yaml:"name"`
	Items     []testInner          `yaml:"items"`
	ByName    map[string]testInner `yaml:"by_name"`
	Fairness  testScalar           `yaml:"fairness"`
	Ratio     *float64             `yaml:"ratio"`
	On        bool                 `yaml:"on"`
	Internal  string               `yaml:"-"`
	unexposed int
}

var testDocs = Docs{
	"configschema.testScalar":         {Scalar: "mode"},
	"configschema.testRoot.name":      {Text: "n"},
	"configschema.testRoot.items":     {Text: "i"},
	"configschema.testInner.capacity": {Text: "c"},
}

func TestBuild(t *testing.T) {
	t.Parallel()
	root, missing, err := Build(reflect.TypeOf(testRoot{}), testDocs)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	root.Walk(func(n *Node) { paths = append(paths, n.Path+" "+n.TypeName()) })
	want := "name string|items list of sections|items[].capacity integer|items[].timeout duration|" +
		"by_name map of sections|by_name.*.capacity integer|by_name.*.timeout duration|" +
		"fairness section or string|fairness.mode string|fairness.flow string|ratio number|on boolean"
	if got := strings.Join(paths, "|"); got != want {
		t.Errorf("paths\n got %s\nwant %s", got, want)
	}
	if got := strings.Join(missing, " "); got != "configschema.testInner.timeout configschema.testRoot.by_name configschema.testRoot.fairness configschema.testRoot.on configschema.testRoot.ratio configschema.testScalar.flow configschema.testScalar.mode" {
		t.Errorf("missing docs: %s", got)
	}
}

func TestBuildRefusesUndocumentedScalarForm(t *testing.T) {
	t.Parallel()
	if _, _, err := Build(reflect.TypeOf(testRoot{}), Docs{}); err == nil || !strings.Contains(err.Error(), "Scalar") {
		t.Fatalf("a type with its own UnmarshalYAML and no Scalar doc: err %v", err)
	}
}

func TestCheckWalksListsMapsAndScalarForms(t *testing.T) {
	t.Parallel()
	root, _, err := Build(reflect.TypeOf(testRoot{}), testDocs)
	if err != nil {
		t.Fatal(err)
	}
	file := "name: x\nitems:\n  - {capacity: 1, timeout: 3}\nby_name:\n  a: {capcity: 2}\nfairness: off\nratio: 0.5\non: true\n"
	var got []string
	for _, p := range Check([]byte(file), root) {
		got = append(got, p.String())
	}
	want := []string{
		`3:28: items[0].timeout: "3" is not a duration; write "3s"`,
		`5:7: unknown key "capcity" in by_name.a; did you mean "capacity"?`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRegression_YAMLErrorsNameTheirLine: a flow sequence left open on
// line 2 was reported at 1:1 (yaml.v3 counts a parser error's line from
// 0); a scanner error's line was right and stays so.
func TestRegression_YAMLErrorsNameTheirLine(t *testing.T) {
	t.Parallel()
	root, _, err := Build(reflect.TypeOf(testRoot{}), testDocs)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, want string }{
		{"name: x\nitems: [oops\n", "2:1: not YAML: did not find expected ',' or ']'"},
		{"name: x\nratio: 1\non: true\nitems:\n  - capacity: 1\n   timeout: 2s\n", "5:1: not YAML: did not find expected '-' indicator"},
		{"name: x\nratio: 1\nitems: @x\n", "3:1: not YAML: found character that cannot start any token"},
		{"name: x\non: true\nby_name: {a: 1\n", "3:1: not YAML: did not find expected ',' or '}'"},
	} {
		ps := Check([]byte(tc.file), root)
		if len(ps) != 1 || ps[0].String() != tc.want {
			t.Errorf("%q: got %v, want %s", tc.file, ps, tc.want)
		}
	}
}

func TestDistance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want int
	}{{"capcity", "capacity", 1}, {"capacity", "capacity", 0}, {"moedls", "models", 1}, {"", "abc", 3}, {"listen", "node_listen", 5}} {
		if got := distance(c.a, c.b); got != c.want {
			t.Errorf("distance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{30 * time.Second: "30s", 5 * time.Minute: "5m", time.Hour: "1h", 90 * time.Minute: "1h30m", 200 * time.Millisecond: "200ms", 61 * time.Second: "1m1s"} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
