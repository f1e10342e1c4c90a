// Package modelname is the one rule by which iop compares model names, on
// the edge and on the node: Ollama's. A name without a tag means its
// ":latest" tag (Ollama API doc, "Model names": the tag "will default to
// latest"), so "tiny" and "tiny:latest" name one model; "tiny:7b" is
// another. The tag is what follows the last ':' after the last '/', so a
// registry host's port ("host:5000/ns/tiny") is no tag.
//
// Every place that compares a configured or requested name with a served
// one (alias targets, requested names, /api/show, per-key model lists,
// the prefix index) uses Same, Key or Alternative, never ==.
package modelname

import "strings"

// LatestTag is the tag of a name written without one.
const LatestTag = ":latest"

// Tagged reports whether name carries a tag: a ':' after its last '/'.
func Tagged(name string) bool {
	return strings.Contains(name[strings.LastIndex(name, "/")+1:], ":")
}

// Key is name as a comparison key: name with ":latest" when it has no
// tag, else name. Two names name one model exactly when their keys are
// equal. The empty name is its own key.
func Key(name string) string {
	if name == "" || Tagged(name) {
		return name
	}
	return name + LatestTag
}

// Same reports whether a and b name one model.
func Same(a, b string) bool {
	if a == b {
		return true
	}
	return Key(a) == Key(b)
}

// Alternative returns the other spelling of name under the rule: "x" for
// "x:latest", "x:latest" for "x", and "" for a name with another tag (or
// the empty name), which has none. A map keyed by names as they were
// written is looked up under the rule by name, then Alternative(name).
func Alternative(name string) string {
	if base, ok := strings.CutSuffix(name, LatestTag); ok && base != "" && !strings.HasSuffix(base, "/") {
		return base
	}
	if name == "" || Tagged(name) {
		return ""
	}
	return name + LatestTag
}

// Known returns the name in names that the model name name means: name
// itself, else its other spelling ("x" and "x:latest", Alternative); ok
// is false when neither is there.
func Known(names []string, name string) (string, bool) {
	alt := Alternative(name)
	found := ""
	for _, n := range names {
		if n == name {
			return n, true
		}
		if alt != "" && n == alt {
			found = n
		}
	}
	return found, found != ""
}
