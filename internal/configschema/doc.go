// Package configschema is the schema of iop's config files, derived by
// reflection from the Go structs they decode into (their yaml tags) and a
// table of docs keyed by Go type and YAML key, so that nothing is written
// twice.
//
// From one schema come:
//   - Check: the problems of a YAML file in config words, with line and
//     column (unknown keys with a suggestion, values of the wrong type);
//   - Kind.Table: the rows of the reference (docs/config.md): every key
//     with its type, default, reload behaviour and an example;
//   - Kind.JSONSchema: a JSON Schema for editors.
//
// What the schema cannot say (ranges, required keys, keys that go in
// pairs) stays in each config's Validate method.
//
// Concurrency: nothing here starts goroutines or holds locks; a Node tree
// is immutable once built.
package configschema
