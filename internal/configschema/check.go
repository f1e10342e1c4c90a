package configschema

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Problem is one thing wrong in a config file, at a line and column (1-based;
// 0 when unknown), in config words.
type Problem struct {
	Line, Column int
	Message      string
}

// String is "LINE:COL: message" (or the message alone without a position).
func (p Problem) String() string {
	if p.Line == 0 {
		return p.Message
	}
	return fmt.Sprintf("%d:%d: %s", p.Line, p.Column, p.Message)
}

// Problems are a file's problems; as an error, one per line, each prefixed
// with File.
type Problems struct {
	File string
	List []Problem
}

// Error is every problem on its own line: "FILE:LINE:COL: message", or
// "FILE: message" for one without a position.
func (ps *Problems) Error() string {
	var b strings.Builder
	for i, p := range ps.List {
		if i > 0 {
			b.WriteByte('\n')
		}
		if ps.File != "" {
			b.WriteString(ps.File)
			b.WriteByte(':')
			if p.Line == 0 {
				b.WriteByte(' ')
			}
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// Is makes a *Problems match ErrInvalid.
func (ps *Problems) Is(target error) bool { return target == ErrInvalid }

// ErrInvalid marks a config file that does not fit its schema.
var ErrInvalid = errors.New("invalid config file")

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// parserProblem holds the problems of yaml.v3's parser (parserc.go), as
// opposed to its scanner's.
var parserProblem = map[string]bool{
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
	"did not find expected '-' indicator":    true,
	"did not find expected <document start>": true,
	"did not find expected <stream-start>":   true,
	"did not find expected key":              true,
	"did not find expected node content":     true,
	"found duplicate %TAG directive":         true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found undefined tag handle":             true,
}

// Check parses data as YAML and reports every key and value that does not
// fit the schema root: unknown keys (with the nearest known key as a
// suggestion), values of the wrong shape or type, repeated keys. It says
// nothing of what Validate checks (ranges, required keys, pairs of keys).
// An empty document has no problems.
func Check(data []byte, root *Node) []Problem {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		msg := err.Error()
		p := Problem{Message: "not YAML: " + strings.TrimPrefix(msg, "yaml: ")}
		if m := yamlLine.FindStringSubmatch(msg); m != nil {
			p.Line, _ = strconv.Atoi(m[1])
			p.Column = 1
			p.Message = "not YAML: " + msg[len(m[0]):]
			if parserProblem[msg[len(m[0]):]] {
				// yaml.v3 (decode.go, parser.fail) gives a parser error's
				// line 0-based and a scanner error's 1-based.
				p.Line++
			}
		}
		return []Problem{p}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil
	}
	c := checker{root: root}
	c.value(doc.Content[0], root, "")
	sort.SliceStable(c.out, func(i, j int) bool {
		a, b := c.out[i], c.out[j]
		return a.Line < b.Line || a.Line == b.Line && a.Column < b.Column
	})
	return c.out
}

type checker struct {
	root *Node
	out  []Problem
}

func (c *checker) add(n *yaml.Node, format string, args ...any) {
	c.out = append(c.out, Problem{Line: n.Line, Column: n.Column, Message: fmt.Sprintf(format, args...)})
}

// label is how a message names the value at path: "queue.queue_timeout: ",
// or nothing for the document itself.
func label(path string) string {
	if path == "" {
		return ""
	}
	return path + ": "
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a section (key: value lines)"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("%q", n.Value)
}

func (c *checker) value(y *yaml.Node, s *Node, path string) {
	for y.Kind == yaml.AliasNode && y.Alias != nil {
		y = y.Alias
	}
	if isNull(y) {
		return // a key with no value keeps its default
	}
	switch s.Type {
	case Section:
		if y.Kind == yaml.ScalarNode && s.ScalarKey != "" {
			c.value(y, s.Field(s.ScalarKey), path)
			return
		}
		if y.Kind != yaml.MappingNode {
			c.add(y, "%swant a section of keys (%s), not %s", label(path), keyList(s), kindName(y))
			return
		}
		c.section(y, s, path)
	case List:
		if y.Kind != yaml.SequenceNode {
			c.add(y, "%swant a list, such as [%s], not %s", label(path), sampleItems(s.Elem), kindName(y))
			return
		}
		for i, item := range y.Content {
			c.value(item, s.Elem, fmt.Sprintf("%s[%d]", path, i))
		}
	case Map:
		if y.Kind != yaml.MappingNode {
			c.add(y, "%swant a section of names and their values, not %s", label(path), kindName(y))
			return
		}
		seen := make(map[string]int)
		for i := 0; i+1 < len(y.Content); i += 2 {
			k, v := y.Content[i], y.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				c.add(k, "%sa name must be plain text", label(path))
				continue
			}
			if line, ok := seen[k.Value]; ok {
				c.add(k, "%s%q is repeated (first at line %d)", label(path), k.Value, line)
			}
			seen[k.Value] = k.Line
			c.value(v, s.Elem, path+"."+k.Value)
		}
	default:
		c.scalar(y, s, path)
	}
}

func (c *checker) section(y *yaml.Node, s *Node, path string) {
	seen := make(map[string]int)
	for i := 0; i+1 < len(y.Content); i += 2 {
		k, v := y.Content[i], y.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			c.add(k, "%sa key must be plain text", label(path))
			continue
		}
		p := k.Value
		if path != "" {
			p = path + "." + k.Value
		}
		f := s.Field(k.Value)
		if f == nil {
			c.add(k, "%s", c.unknown(k.Value, s, path))
			continue
		}
		if line, ok := seen[k.Value]; ok {
			c.add(k, "key %q is repeated (first at line %d)", p, line)
		}
		seen[k.Value] = k.Line
		c.value(v, f, p)
	}
}

// unknown words the message for an unknown key: the nearest key of the
// section, else where in the file such a key belongs.
func (c *checker) unknown(key string, s *Node, path string) string {
	where := ""
	if path != "" {
		where = " in " + path
	}
	if near := nearest(key, s); near != "" {
		return fmt.Sprintf("unknown key %q%s; did you mean %q?", key, where, near)
	}
	var elsewhere []string
	c.root.Walk(func(n *Node) {
		if n.Key == key {
			elsewhere = append(elsewhere, n.Path)
		}
	})
	if len(elsewhere) > 0 {
		return fmt.Sprintf("unknown key %q%s; it belongs at %s", key, where, strings.Join(elsewhere, " or "))
	}
	return fmt.Sprintf("unknown key %q%s; the keys here are %s", key, where, keyList(s))
}

// nearest is the key of s closest to key (same letters with - for _, or an
// edit distance of at most a third of its length, at least 1), or "".
func nearest(key string, s *Node) string {
	norm := strings.ToLower(strings.ReplaceAll(key, "-", "_"))
	best, bestD := "", 0
	for _, f := range s.Fields {
		if f.Key == norm {
			return f.Key
		}
		d := distance(norm, f.Key)
		if d <= max(1, len(f.Key)/3) && (best == "" || d < bestD) {
			best, bestD = f.Key, d
		}
	}
	return best
}

// distance is the Levenshtein distance of a and b, a transposition
// counting as one edit (optimal string alignment).
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

func keyList(s *Node) string {
	keys := make([]string, 0, len(s.Fields))
	for _, f := range s.Fields {
		keys = append(keys, f.Key)
	}
	if len(keys) > 8 {
		keys = append(keys[:8:8], "...")
	}
	return strings.Join(keys, ", ")
}

func sampleItems(e *Node) string {
	switch e.Type {
	case Int:
		return "1, 2"
	case Duration:
		return "1s, 5s"
	case Section:
		return "{...}, {...}"
	}
	return "a, b"
}

var (
	numberLike = regexp.MustCompile(`^[-+]?(\d+(\.\d*)?|\.\d+)$`)
	wholeLike  = regexp.MustCompile(`^[-+]?\d+$`)
)

func (c *checker) scalar(y *yaml.Node, s *Node, path string) {
	if y.Kind != yaml.ScalarNode {
		c.add(y, "%swant %s, not %s", label(path), article(s), kindName(y))
		return
	}
	quoted := y.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0
	v := y.Value
	switch s.Type {
	case Duration:
		if y.Tag == "!!int" || y.Tag == "!!float" || numberLike.MatchString(v) {
			c.add(y, "%s%q is not a duration; write %q", label(path), v, v+"s")
			return
		}
		if _, err := time.ParseDuration(v); err != nil {
			c.add(y, "%s%q is not a duration; write a number and a unit, such as \"30s\", \"1m30s\" or \"500ms\"", label(path), v)
		}
	case Time:
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
			c.add(y, "%s%q is not an RFC 3339 time; write it as \"2026-12-31T00:00:00Z\"", label(path), v)
		}
	case Int:
		if y.Tag == "!!int" {
			return
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil && y.Tag == "!!float" && f == float64(int64(f)) {
			return // 2.0: yaml.v3 reads it as 2
		}
		if quoted && wholeLike.MatchString(v) {
			c.add(y, "%s%q is quoted, so it is text; write %s", label(path), v, v)
			return
		}
		c.add(y, "%s%q is not a whole number", label(path), v)
	case Float:
		if y.Tag == "!!int" || y.Tag == "!!float" {
			return
		}
		if quoted && numberLike.MatchString(v) {
			c.add(y, "%s%q is quoted, so it is text; write %s", label(path), v, v)
			return
		}
		c.add(y, "%s%q is not a number", label(path), v)
	case Bool:
		// yaml.v3 also reads YAML 1.1's yes/no/on/off into a boolean.
		switch v {
		case "y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "n", "N", "no", "No", "NO", "off", "Off", "OFF":
			if !quoted {
				return
			}
		}
		if y.Tag == "!!bool" {
			return
		}
		c.add(y, "%s%q is not true or false", label(path), v)
	case String:
		if y.Tag == "!!binary" {
			c.add(y, "%swant text, not binary data", label(path))
		}
	}
}

func article(s *Node) string {
	switch s.Type {
	case Int:
		return "a whole number"
	case Float:
		return "a number"
	case Bool:
		return "true or false"
	case Duration:
		return "a duration such as \"30s\""
	case Time:
		return "an RFC 3339 time such as \"2026-12-31T00:00:00Z\""
	}
	return "a string"
}
