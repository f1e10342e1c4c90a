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

// check reports (t.Errorf) every way doc breaks the named schema; what
// names the answer in the report.
func (v *specValidator) check(what, schema string, doc []byte) {
	v.t.Helper()
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
		return
	}
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "\n  %s: %s", e.Message, e.Reason)
		for _, se := range e.SchemaValidationErrors {
			fmt.Fprintf(&b, "\n    %s: %s", se.FieldPath, se.Reason)
		}
	}
	v.t.Errorf("%s does not validate as %s: %s%s", what, schema, clipDoc(doc), b.String())
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
	t.Parallel()
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
	_ = json.Valid
}
