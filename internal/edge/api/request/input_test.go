package request

import (
	"iop/internal/jsonvalue"
	"slices"
	"testing"
)

func TestDecodeTextInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		raw      string
		nonEmpty bool
		want     textInput
		param    string // of the error; "" when accepted
	}{
		{`"hello world"`, true, textInput{Items: 1, Chars: 11}, ""},
		{`["a","bé"]`, true, textInput{Items: 2, Chars: 3}, ""},
		{`[1,2,3]`, true, textInput{Items: 1, Tokens: 3, TokenIDs: true}, ""},
		{`[[1,2],[3]]`, true, textInput{Items: 2, Tokens: 3, TokenIDs: true}, ""},
		{`[[]]`, false, textInput{Items: 1, TokenIDs: true}, ""},
		{`""`, false, textInput{Items: 1}, ""},
		{`""`, true, textInput{}, "input"},
		{`[""]`, true, textInput{}, "input[0]"},
		{`[[]]`, true, textInput{}, "input[0]"},
		{`[]`, false, textInput{}, "input"},
		{`null`, false, textInput{}, "input"},
		{`{}`, false, textInput{}, "input"},
		{`["a",1]`, false, textInput{}, "input[1]"},
		{`[1,"a"]`, false, textInput{}, "input[1]"},
		{`[1,-1]`, false, textInput{}, "input[1]"},
		{`[1,null]`, false, textInput{}, "input[1]"},
		{`[1,1.5]`, false, textInput{}, "input[1]"},
		{`[[1],"a"]`, false, textInput{}, "input[1]"},
		{`[[1,2147483648]]`, false, textInput{}, "input[0][1]"},
	} {
		v, err := jsonvalue.Parse([]byte(tc.raw))
		if err != nil {
			t.Fatal(err)
		}
		got, err := textInputOf(v, "input", tc.nonEmpty)
		if tc.param == "" {
			if err != nil || got != tc.want {
				t.Errorf("%s: got %+v, %v; want %+v", tc.raw, got, err, tc.want)
			}
			continue
		}
		re, ok := err.(*FieldError)
		if !ok || re.Field != tc.param {
			t.Errorf("%s: error %v, want one naming %s", tc.raw, err, tc.param)
		}
	}
}

// FuzzDecodeEmbeddingsRequest: the decoder never panics, an accepted body
// has at least one input and at most 2048, and every rejection is a
// *FieldError.
func FuzzDecodeEmbeddingsRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","input":"x"}`,
		`{"model":"m","input":[[1,2],[3]],"dimensions":8,"encoding_format":"base64"}`,
		`{"model":"m","input":["a",""]}`,
		`{"model":"m","input":[1e3]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeEmbeddingsRequest(body)
		if err != nil {
			if _, ok := err.(*FieldError); !ok {
				t.Fatalf("error %T %v", err, err)
			}
			return
		}
		if req.Inputs < 1 || req.Inputs > maxInputs || req.Model == "" || req.EstimatedInputTokens < 0 {
			t.Fatalf("accepted %s as %+v", body, req)
		}
	})
}

// FuzzDecodeCompletionRequest: the decoder never panics, and every
// rejection is a *FieldError.
func FuzzDecodeCompletionRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","prompt":"x","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":[[1],[2]],"n":2,"best_of":3,"logprobs":5,"echo":true,"suffix":"s"}`,
		`{"model":"m","prompt":"x","logprobs":6}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeCompletionRequest(body)
		if err != nil {
			if _, ok := err.(*FieldError); !ok {
				t.Fatalf("error %T %v", err, err)
			}
			return
		}
		if req.Model == "" || req.EstimatedInputTokens < 0 {
			t.Fatalf("accepted %s as %+v", body, req)
		}
	})
}

// n or best_of above 1 needs "choices" (tunnel-path providers only).
func TestCompletionNeedsChoices(t *testing.T) {
	t.Parallel()
	for body, want := range map[string][]string{
		`{"model":"m","prompt":"x"}`:                   nil,
		`{"model":"m","prompt":"x","n":1,"best_of":1}`: nil,
		`{"model":"m","prompt":"x","n":null}`:          nil,
		`{"model":"m","prompt":"x","n":2}`:             {"choices"},
		`{"model":"m","prompt":"x","best_of":3}`:       {"choices"},
		`{"model":"m","prompt":"x","n":2,"best_of":2}`: {"choices"},
	} {
		req, err := decodeCompletionRequest([]byte(body))
		if err != nil || !slices.Equal(req.Needs, want) {
			t.Errorf("%s: needs %v (%v), want %v", body, req.Needs, err, want)
		}
	}
}

// A batch of prompts needs "prompt_batch", token ids "token_input" (both
// met by tunnel-path providers only: Ollama takes one prompt string and
// embeds text); one prompt string, one token-free input, or a one-item
// array of strings needs neither.
func TestBatchAndTokenNeeds(t *testing.T) {
	t.Parallel()
	for body, want := range map[string][]string{
		`{"model":"m","prompt":"x"}`:             nil,
		`{"model":"m","prompt":["x"]}`:           nil,
		`{"model":"m","prompt":["x","y"]}`:       {"prompt_batch"},
		`{"model":"m","prompt":[1,2,3]}`:         {"token_input"},
		`{"model":"m","prompt":[[1,2,3]]}`:       {"token_input"},
		`{"model":"m","prompt":[[1],[2]]}`:       {"prompt_batch", "token_input"},
		`{"model":"m","prompt":["x","y"],"n":2}`: {"prompt_batch", "choices"},
		`{"model":"m","prompt":[[1],[2]],"n":2}`: {"prompt_batch", "token_input", "choices"},
		`{"model":"m","prompt":[1],"best_of":2}`: {"token_input", "choices"},
	} {
		req, err := decodeCompletionRequest([]byte(body))
		if err != nil || !slices.Equal(req.Needs, want) {
			t.Errorf("completions %s: needs %v (%v), want %v", body, req.Needs, err, want)
		}
	}
	for body, want := range map[string][]string{
		`{"model":"m","input":"x"}`:         {"embeddings"},
		`{"model":"m","input":["x","y"]}`:   {"embeddings"},
		`{"model":"m","input":[1,2]}`:       {"embeddings", "token_input"},
		`{"model":"m","input":[[1],[2,3]]}`: {"embeddings", "token_input"},
	} {
		req, err := decodeEmbeddingsRequest([]byte(body))
		if err != nil || !slices.Equal(req.Needs, want) {
			t.Errorf("embeddings %s: needs %v (%v), want %v", body, req.Needs, err, want)
		}
	}
}
