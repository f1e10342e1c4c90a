package configschema

import (
	"encoding/json"
	"strconv"
)

// durationPattern is what time.ParseDuration takes: numbers with units.
const durationPattern = `^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`

// JSONSchema is k's schema as a JSON Schema (draft 2020-12) for editors:
// every key with its type, description and default; unknown keys refused.
func (k Kind) JSONSchema() ([]byte, error) {
	s := k.schema(k.Root)
	s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	s["title"] = "iop " + k.Name + " config (" + k.Command + ")"
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func (k Kind) schema(n *Node) map[string]any {
	s := map[string]any{}
	switch n.Type {
	case String:
		s["type"] = "string"
	case Bool:
		s["type"] = "boolean"
	case Int:
		s["type"] = "integer"
	case Float:
		s["type"] = "number"
	case Duration:
		s["type"] = "string"
		s["pattern"] = durationPattern
	case Time:
		s["type"] = "string"
		s["format"] = "date-time"
	case List:
		s["type"] = "array"
		s["items"] = k.schema(n.Elem)
	case Map:
		s["type"] = "object"
		s["additionalProperties"] = k.schema(n.Elem)
	case Section:
		props := map[string]any{}
		for _, f := range n.Fields {
			props[f.Key] = k.schema(f)
		}
		obj := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
		if n.ScalarKey != "" {
			scalar := k.schema(n.Field(n.ScalarKey))
			delete(scalar, "description")
			delete(scalar, "default")
			s["anyOf"] = []any{scalar, obj}
		} else {
			s = obj
		}
	}
	if n.Doc.Text != "" {
		s["description"] = n.Doc.Text
	}
	// Only a default read from the defaults value is a JSON value; a
	// Doc.Default is words ("the host name") and stays in the reference.
	if d := k.Default(n); d != "" && n.Doc.Default == "" && n.Type != Section {
		if v := jsonDefault(n, d); v != nil {
			s["default"] = v
		}
	}
	return s
}

func jsonDefault(n *Node, d string) any {
	switch n.Type {
	case Int:
		if v, err := strconv.ParseInt(d, 10, 64); err == nil {
			return v
		}
	case Float:
		if v, err := strconv.ParseFloat(d, 64); err == nil {
			return v
		}
	case Bool:
		if v, err := strconv.ParseBool(d); err == nil {
			return v
		}
	case String, Duration, Time:
		return d
	}
	return nil
}
