package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/pb33f/libopenapi"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	"github.com/pb33f/libopenapi/datamodel/high/base"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"

	"iop/internal/e2e/harness"
)

// openAISpec is OpenAI's published OpenAPI document, vendored at a pinned
// commit (testdata/openai-openapi/README.md), built once per test binary.
var openAISpec = sync.OnceValues(func() (*v3.Document, error) {
	raw, err := os.ReadFile(filepath.Join("testdata", "openai-openapi", "openapi.yaml"))
	if err != nil {
		return nil, err
	}
	doc, err := libopenapi.NewDocument(raw)
	if err != nil {
		return nil, err
	}
	m, err := doc.BuildV3Model()
	if m == nil {
		return nil, err
	}
	return &m.Model, nil // err lists only warnings of the document's own (circular references)
})

// specSchema returns the named schema of the document's components.
func specSchema(t *testing.T, name string) *base.Schema {
	t.Helper()
	doc, err := openAISpec()
	if err != nil {
		t.Fatalf("loading OpenAI's OpenAPI document: %v", err)
	}
	proxy, ok := doc.Components.Schemas.Get(name)
	if !ok {
		t.Fatalf("no schema %s in OpenAI's OpenAPI document", name)
	}
	s := proxy.Schema()
	if s == nil {
		t.Fatalf("schema %s: %v", name, proxy.GetBuildError())
	}
	return s
}

// schemasOf30 holds the names of the schemas that compile as OpenAPI 3.0
// only (they say "nullable").
var schemasOf30 sync.Map

// specValidator validates JSON documents against schemas of OpenAI's
// OpenAPI document.
type specValidator struct {
	t  *testing.T
	sv schema_validation.SchemaValidator
}

func newSpecValidator(t *testing.T) *specValidator {
	return &specValidator{t: t, sv: schema_validation.NewSchemaValidator()}
}

// streamEventVariants maps the type of each event of ResponseStreamEvent
// to the name of its schema: the document's ResponseStreamEvent is anyOf
// 60-odd event schemas, each with its own const type, so an event is valid
// exactly when it is valid against the variant its type names. Compiling
// that one variant, not the whole union, is what keeps the check cheap
// under the race detector (the union alone takes ~30 CPU-seconds).
var streamEventVariants = sync.OnceValues(func() (map[string]string, error) {
	doc, err := openAISpec()
	if err != nil {
		return nil, err
	}
	union, ok := doc.Components.Schemas.Get("ResponseStreamEvent")
	if !ok || union.Schema() == nil {
		return nil, fmt.Errorf("no schema ResponseStreamEvent")
	}
	variants := map[string]string{}
	for _, p := range append(union.Schema().AnyOf, union.Schema().OneOf...) {
		// Read through the component, not the union's reference to it:
		// libopenapi leaves some references inside the union unresolved.
		name, ok := strings.CutPrefix(p.GetReference(), "#/components/schemas/")
		var s *base.Schema
		if c, found := doc.Components.Schemas.Get(name); ok && found {
			s = c.Schema()
		}
		if s == nil || s.Properties == nil {
			return nil, fmt.Errorf("ResponseStreamEvent variant %q is not a named object schema", p.GetReference())
		}
		typ, ok := s.Properties.Get("type")
		if !ok || typ.Schema() == nil || len(typ.Schema().Enum) != 1 {
			return nil, fmt.Errorf("ResponseStreamEvent variant %s has no single-valued type", name)
		}
		variants[typ.Schema().Enum[0].Value] = name
	}
	return variants, nil
})

// check reports (t.Errorf) every way doc breaks the named schema; what
// names the answer in the report.
func (v *specValidator) check(what, schema string, doc []byte) {
	v.t.Helper()
	if problems := v.problems(schema, doc); problems != "" {
		v.t.Errorf("%s does not validate as %s: %s%s", what, schema, clipDoc(doc), problems)
	}
}

// problems returns every way doc breaks the named schema, one per line,
// or "" when it validates. A ResponseStreamEvent is validated against the
// variant its type names (streamEventVariants).
func (v *specValidator) problems(schema string, doc []byte) string {
	v.t.Helper()
	asked := schema
	if schema == "ResponseStreamEvent" {
		variants, err := streamEventVariants()
		if err != nil {
			v.t.Fatalf("reading OpenAI's OpenAPI document: %v", err)
		}
		var ev struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(doc, &ev)
		variant, ok := variants[ev.Type]
		if !ok {
			return fmt.Sprintf("\n  type %q is none of its variants'", ev.Type)
		}
		schema = variant
	}
	version := float32(3.1)
	if _, ok := schemasOf30.Load(schema); ok {
		version = 3.0
	}
	ok, errs := v.sv.ValidateSchemaBytesWithVersion(specSchema(v.t, schema), doc, version)
	if !ok && version == 3.1 && len(errs) == 1 && strings.Contains(errs[0].Reason, "'nullable'") {
		// Some of the document's schemas still say "nullable" (OpenAPI
		// 3.0), which a 3.1 compile refuses: those are read as 3.0. The
		// validator caches compiled schemas, not failed compiles: the
		// name is remembered so the 3.1 compile is tried once.
		schemasOf30.Store(schema, true)
		ok, errs = v.sv.ValidateSchemaBytesWithVersion(specSchema(v.t, schema), doc, 3.0)
	}
	if ok {
		return ""
	}
	var b strings.Builder
	if schema != asked {
		fmt.Fprintf(&b, "\n  (its variant %s)", schema)
	}
	for _, e := range errs {
		fmt.Fprintf(&b, "\n  %s: %s", e.Message, e.Reason)
		for _, se := range e.SchemaValidationErrors {
			fmt.Fprintf(&b, "\n    %s: %s", se.FieldPath, se.Reason)
		}
	}
	return b.String()
}

func clipDoc(doc []byte) string {
	if len(doc) > 600 {
		return string(doc[:600]) + "…"
	}
	return string(doc)
}

// sseEvents returns the data of each event of an SSE body but "[DONE]",
// with its event name ("" when none).
func sseEvents(t *testing.T, body []byte) (names []string, data [][]byte) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			d := strings.TrimPrefix(line, "data: ")
			if d != "[DONE]" {
				names, data = append(names, name), append(data, []byte(d))
			}
		case line == "":
			name = ""
		}
	}
	return names, data
}

// Every JSON answer and every SSE event of /v1/chat/completions (streamed
// and not, with tools), /v1/responses (streamed and not, with tools),
// /v1/embeddings and /v1/models validates against OpenAI's published
// OpenAPI document, on both execution paths.
func TestOpenAPIAnswersValidate(t *testing.T) {
	harness.ParallelLong(t)
	env := startEndpointEnv(t)
	v := newSpecValidator(t)
	post := func(t *testing.T, path, body string) []byte {
		t.Helper()
		resp, err := env.httpClient.Post("http://"+env.e.HTTPAddr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("POST %s: %d %s", path, resp.StatusCode, b)
		}
		return b
	}
	get := func(t *testing.T, path string) []byte {
		t.Helper()
		resp, err := env.httpClient.Get("http://" + env.e.HTTPAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return b
	}
	const tools = `"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
	const respTools = `"tools":[{"type":"function","name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}]`
	for _, p := range env.byPath {
		t.Run(p.name, func(t *testing.T) {
			v := &specValidator{t: t, sv: v.sv}
			chats := map[string]string{
				"text":  `{"model":"` + p.model + `","messages":[{"role":"user","content":"Say hello"}],"max_tokens":12}`,
				"tools": `{"model":"` + p.model + `","messages":[{"role":"user","content":"Weather in Paris? call get_weather"}],` + tools + `}`,
			}
			for name, body := range chats {
				v.check("chat "+name, "CreateChatCompletionResponse", post(t, "/v1/chat/completions", body))
				stream := strings.Replace(body, "{", `{"stream":true,"stream_options":{"include_usage":true},`, 1)
				_, events := sseEvents(t, post(t, "/v1/chat/completions", stream))
				if len(events) == 0 {
					t.Errorf("chat %s: no events", name)
				}
				for i, ev := range events {
					v.check(fmt.Sprintf("chat %s event %d", name, i), "CreateChatCompletionStreamResponse", ev)
				}
			}
			responses := map[string]string{
				"text":  `{"model":"` + p.model + `","input":"Say hello","max_output_tokens":16}`,
				"tools": `{"model":"` + p.model + `","input":"Weather in Paris? call get_weather",` + respTools + `}`,
			}
			for name, body := range responses {
				v.check("response "+name, "Response", post(t, "/v1/responses", body))
				stream := strings.Replace(body, "{", `{"stream":true,`, 1)
				names, events := sseEvents(t, post(t, "/v1/responses", stream))
				if len(events) == 0 {
					t.Errorf("responses %s: no events", name)
				}
				for i, ev := range events {
					v.check(fmt.Sprintf("responses %s event %d (%s)", name, i, names[i]), "ResponseStreamEvent", ev)
				}
			}
			v.check("embeddings", "CreateEmbeddingResponse", post(t, "/v1/embeddings", `{"model":"`+p.model+`","input":["a","b c"]}`))
			v.check("model", "Model", get(t, "/v1/models/"+p.model))
		})
	}
	v.check("models", "ListModelsResponse", get(t, "/v1/models"))
}

// The validator itself: a Responses stream event is held to the variant
// its type names, and an event of no variant's type is refused.
func TestSpecValidatorHoldsEventsToTheirVariant(t *testing.T) {
	harness.Parallel(t)
	v := newSpecValidator(t)
	for _, c := range []struct {
		name, event string
		valid       bool
	}{
		{"text delta", `{"type":"response.output_text.delta","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"hi","logprobs":[]}`, true},
		{"text delta whose delta is a number", `{"type":"response.output_text.delta","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"delta":7,"logprobs":[]}`, false},
		{"text delta without item_id", `{"type":"response.output_text.delta","sequence_number":3,"output_index":0,"content_index":0,"delta":"hi","logprobs":[]}`, false},
		{"text delta shaped as a refusal delta", `{"type":"response.output_text.delta","sequence_number":3,"item_id":"msg_1","output_index":0,"content_index":0,"refusal":"no"}`, false},
		{"unknown type", `{"type":"response.output_text.whisper","sequence_number":3}`, false},
		{"no type", `{"sequence_number":3}`, false},
	} {
		problems := v.problems("ResponseStreamEvent", []byte(c.event))
		if (problems == "") != c.valid {
			t.Errorf("%s: valid %v, want %v%s", c.name, problems == "", c.valid, problems)
		}
	}
}
