package translate

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzDecodeFields: decoding the known fields member by member gives the
// struct and the error the whole body re-encoded and decoded at once gave
// (what decodeFields did before it decoded each member once).
func FuzzDecodeFields(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"p","context":[1,2],"images":["a"],"raw":true}`,
		`{"MODEL":"m","Model":"n","model":"o"}`, `{"context":["x"],"images":[1],"raw":"yes"}`,
		`{"prompt":1,"model":2}`, `{"context":[1e400]}`, `{"Raw":true,"raw":null}`, `{"model":null,"system":"s"}`,
	} {
		f.Add([]byte(s))
	}
	type fields struct {
		Model    string            `json:"model"`
		Prompt   string            `json:"prompt"`
		Suffix   string            `json:"suffix"`
		System   string            `json:"system"`
		Template string            `json:"template"`
		Context  []int64           `json:"context"`
		Images   []string          `json:"images"`
		Raw      bool              `json:"raw"`
		Messages []json.RawMessage `json:"messages"`
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var top map[string]json.RawMessage
		if json.Unmarshal(body, &top) != nil || top == nil {
			return
		}
		var got, want fields
		gotErr := decodeFields(top, &got)
		b, err := json.Marshal(top)
		if err != nil {
			t.Fatal(err)
		}
		var wantErr error
		if err := json.Unmarshal(b, &want); err != nil {
			wantErr = typeError(err, "")
		}
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotErr, wantErr) {
			t.Fatalf("body %s:\n got %+v, %v\nwant %+v, %v", body, got, gotErr, want, wantErr)
		}
	})
}
