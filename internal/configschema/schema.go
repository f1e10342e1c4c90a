package configschema

import (
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Type is the YAML shape of a value, in the words the reference uses.
type Type int

// The value types of a config file.
const (
	String Type = iota
	Bool
	Int
	Float
	Duration
	Time    // an RFC 3339 instant
	List    // a YAML sequence of Elem
	Map     // a YAML mapping of names to Elem
	Section // a YAML mapping of the Fields
)

// Doc is what the reference says of one key: the text, the default when it
// cannot be read from the kind's default value, whether the edge applies it
// on a reload, and an example value (YAML, as written after "key: ").
// Scalar, on a struct type's own entry, names the field that a plain
// scalar sets (`fairness: off` sets fairness.mode).
type Doc struct {
	Text    string
	Default string
	Example string
	Reload  bool
	Scalar  string
}

// Docs maps "pkg.Type.key" (the Go type holding the field, then its YAML
// key) to its Doc, and "pkg.Type" to the Doc of a struct type that has a
// scalar form. A type's fields are documented once wherever it is used.
type Docs map[string]Doc

// Node is one key of a config file (or the file itself, Key ""), derived
// from the Go struct field the file decodes into.
type Node struct {
	Key    string // the YAML key; "" for the root, a list item or a map value
	Path   string // "queue.queue_timeout", "providers[].capacity", "models.*.targets"
	Type   Type
	GoType reflect.Type
	Elem   *Node   // List, Map: the item
	Fields []*Node // Section: its keys, in struct order
	Doc    Doc
	// ScalarKey, for a Section that also accepts a plain scalar, is the
	// field the scalar sets.
	ScalarKey string
	field     []int // the Go field's index path in its struct (reflect.Value.FieldByIndex)
}

var (
	durationType    = reflect.TypeOf(time.Duration(0))
	timeType        = reflect.TypeOf(time.Time{})
	unmarshalerType = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()
)

// Build derives the schema of the struct type t from its fields' yaml tags
// and docs. It returns the keys docs lacks ("pkg.Type.key") beside the
// tree, so a test can demand that every key is documented; a field of a
// type it cannot map, or an untagged field, is an error.
func Build(t reflect.Type, docs Docs) (*Node, []string, error) {
	b := builder{docs: docs}
	root, err := b.node(t, "", "")
	if err != nil {
		return nil, nil, err
	}
	sort.Strings(b.missing)
	return root, slices.Compact(b.missing), nil
}

type builder struct {
	docs    Docs
	missing []string
}

func docKey(t reflect.Type) string { return t.String() }

func (b *builder) node(t reflect.Type, key, path string) (*Node, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	n := &Node{Key: key, Path: path, GoType: t}
	switch {
	case t == durationType:
		n.Type = Duration
	case t == timeType:
		n.Type = Time
	case t.Kind() == reflect.String:
		n.Type = String
	case t.Kind() == reflect.Bool:
		n.Type = Bool
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		n.Type = Int
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		n.Type = Float
	case t.Kind() == reflect.Slice:
		n.Type = List
		e, err := b.node(t.Elem(), "", path+"[]")
		if err != nil {
			return nil, err
		}
		n.Elem = e
	case t.Kind() == reflect.Map:
		if t.Key().Kind() != reflect.String {
			return nil, fmt.Errorf("configschema: %s: map key %s is not a string", path, t.Key())
		}
		n.Type = Map
		e, err := b.node(t.Elem(), "", path+".*")
		if err != nil {
			return nil, err
		}
		n.Elem = e
	case t.Kind() == reflect.Struct:
		n.Type = Section
		if reflect.PointerTo(t).Implements(unmarshalerType) {
			d, ok := b.docs[docKey(t)]
			if !ok || d.Scalar == "" {
				return nil, fmt.Errorf("configschema: %s: %s reads its own YAML; give Docs[%q] a Scalar field", path, t, docKey(t))
			}
			n.ScalarKey = d.Scalar
		}
		fields, err := b.fields(t, path, nil)
		if err != nil {
			return nil, err
		}
		n.Fields = fields
	default:
		return nil, fmt.Errorf("configschema: %s: no YAML shape for %s", path, t)
	}
	return n, nil
}

// fields are the keys of struct t (at path; index is t's own index path
// in the section's struct): one per field with a plain yaml:"key" tag,
// and the keys of an embedded struct tagged yaml:",inline" in its place,
// documented under that struct's own type.
func (b *builder) fields(t reflect.Type, path string, index []int) ([]*Node, error) {
	var out []*Node
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		at := append(slices.Clone(index), i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && opts == "inline" && f.Type.Kind() == reflect.Struct {
			inner, err := b.fields(f.Type, path, at)
			if err != nil {
				return nil, err
			}
			out = append(out, inner...)
			continue
		}
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" || opts != "" {
			return nil, fmt.Errorf("configschema: %s.%s: want a plain yaml:\"key\" tag, have %q", t, f.Name, tag)
		}
		p := name
		if path != "" {
			p = path + "." + name
		}
		c, err := b.node(f.Type, name, p)
		if err != nil {
			return nil, err
		}
		dk := docKey(t) + "." + name
		d, ok := b.docs[dk]
		if !ok {
			b.missing = append(b.missing, dk)
		}
		c.Doc, c.field = d, at
		out = append(out, c)
	}
	return out, nil
}

// Field returns the key named key of a Section, or nil.
func (n *Node) Field(key string) *Node {
	for _, f := range n.Fields {
		if f.Key == key {
			return f
		}
	}
	return nil
}

// Walk calls fn for every key below n (not n itself), depth first in
// struct order; list items and map values are walked through, not visited.
func (n *Node) Walk(fn func(*Node)) {
	var walk func(*Node)
	walk = func(m *Node) {
		switch m.Type {
		case Section:
			for _, f := range m.Fields {
				fn(f)
				walk(f)
			}
		case List, Map:
			walk(m.Elem)
		}
	}
	walk(n)
}

// TypeName is the type in config words: "duration", "list of strings",
// "map of sections", ...
func (n *Node) TypeName() string {
	switch n.Type {
	case String:
		return "string"
	case Bool:
		return "boolean"
	case Int:
		return "integer"
	case Float:
		return "number"
	case Duration:
		return "duration"
	case Time:
		return "time (RFC 3339)"
	case List:
		return "list of " + plural(n.Elem)
	case Map:
		return "map of " + plural(n.Elem)
	}
	if n.ScalarKey != "" {
		return "section or string"
	}
	return "section"
}

func plural(n *Node) string {
	switch n.Type {
	case Bool:
		return "booleans"
	case Int:
		return "integers"
	case Float:
		return "numbers"
	case Duration:
		return "durations"
	case Time:
		return "times (RFC 3339)"
	case List, Map:
		return n.TypeName() + "s"
	case Section:
		if n.ScalarKey != "" {
			return "sections or strings"
		}
		return "sections"
	}
	return "strings"
}
