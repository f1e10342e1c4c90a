package configschema

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"time"
)

// Kind is one kind of config file (edge, node, dev): its schema, the value
// its command starts from (defaults filled in), and whether the command
// applies the keys marked Doc.Reload without a restart.
type Kind struct {
	Name     string // "edge", "node", "dev"
	Command  string // "iop edge --config edge.yaml"
	Intro    string // markdown, under the kind's heading
	Root     *Node
	Defaults any // a value of Root's Go type
	Reloads  bool
}

// Default is n's default in config words: Doc.Default when set, else the
// value at n's path in k.Defaults when that is not zero (a key inside a
// list or a map has none there), else "".
func (k Kind) Default(n *Node) string {
	if n.Type == Section {
		return "" // its keys have theirs
	}
	if n.Doc.Default != "" {
		return n.Doc.Default
	}
	if k.Defaults == nil || strings.ContainsAny(n.Path, "[*") {
		return ""
	}
	v := reflect.ValueOf(k.Defaults)
	s := k.Root
	for _, key := range strings.Split(n.Path, ".") {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return ""
			}
			v = v.Elem()
		}
		f := s.Field(key)
		if f == nil || v.Kind() != reflect.Struct {
			return ""
		}
		v, s = v.FieldByIndex(f.field), f
	}
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	if v.IsZero() {
		return ""
	}
	return FormatValue(v.Interface())
}

// FormatValue writes a Go value as it is written in YAML: durations as
// "30s", "5m", "1h30m"; lists as [a, b].
func FormatValue(x any) string {
	switch v := x.(type) {
	case time.Duration:
		return FormatDuration(v)
	case time.Time:
		return v.Format(time.RFC3339)
	case []string:
		return "[" + strings.Join(v, ", ") + "]"
	}
	return fmt.Sprint(x)
}

// FormatDuration is d.String() without zero trailing units: 5m, not 5m0s.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Reload is what the reference says of n's reload: "yes" when the
// command applies it on SIGHUP or a change of the file, else "restart".
func (k Kind) Reload(n *Node) string {
	if n.Type == Section {
		return "" // its keys say
	}
	if k.Reloads && n.Doc.Reload {
		return "yes"
	}
	return "restart"
}

// Example is n's example line ("key: value"), or "" for a section, whose
// keys have their own.
func (k Kind) Example(n *Node) string {
	ex := n.Doc.Example
	if ex == "" {
		ex = k.Default(n)
	}
	if ex == "" || n.Type == Section {
		return ""
	}
	return n.Key + ": " + ex
}

// Table writes the reference table of k's keys in markdown.
func (k Kind) Table(b *bytes.Buffer) {
	b.WriteString("| key | type | default | reload | what it is | example |\n|---|---|---|---|---|---|\n")
	k.Root.Walk(func(n *Node) {
		def := k.Default(n)
		if def != "" {
			def = code(def)
		}
		ex := k.Example(n)
		if ex != "" {
			ex = code(ex)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s |\n", code(n.Path), n.TypeName(), def, k.Reload(n), cell(n.Doc.Text), ex)
	})
}

func code(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	if strings.Contains(s, "`") {
		return "`` " + s + " ``"
	}
	return "`" + s + "`"
}

func cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "\n", " "), "|", `\|`)
}
