package request

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"iop/internal/jsonvalue"
	"iop/internal/translate"
)

// What a client API that translates its own bodies (package ollama)
// checks of what it translated: what the OpenAI route would check in the
// canonical body, from what the translation decoded.

// TranslatedChatNeeds checks a translated chat (translate.Request of
// Operation Chat) as POST /v1/chat/completions checks an OpenAI client's
// (the checks its canonical body could fail: the messages' roles, the
// tools' shape) and returns its needs and estimated input tokens as that
// route finds them in the canonical body, from what the translation
// decoded (Roles, InputChars, Images, Tools, ReasoningEffort) instead of
// decoding the body it generated. The client's tools are parsed here,
// once (the translation passes them on unread). Errors are *FieldError
// naming the field, as the route's.
func TranslatedChatNeeds(tr *translate.Request) (needs []string, estimate int, err error) {
	for i, role := range tr.Roles {
		if !slices.Contains(messageRoles, role) {
			return nil, 0, &FieldError{Field: fmt.Sprintf("messages[%d].role", i), Message: fmt.Sprintf("must be one of %s, got %s",
				strings.Join(messageRoles, ", "), strconv.Quote(Clip(role)))}
		}
	}
	chars := tr.InputChars
	if tr.Tools != nil {
		tools, perr := jsonvalue.Parse(tr.Tools)
		if perr != nil {
			return nil, 0, &FieldError{Field: "tools", Message: "expected an array of tools"}
		}
		if err := checkTools(elemsOf(tools), nil); err != nil {
			return nil, 0, err
		}
		if len(elemsOf(tools)) > 0 {
			needs = append(needs, NeedTools)
		}
		for _, def := range elemsOf(tools) {
			// The canonical body has the tools as json.Marshal writes
			// them: compact, and <, >, &, U+2028 and U+2029 escaped as
			// \u003c and the like (5 characters more each).
			chars += def.Compact + 5*(bytes.Count(def.Raw, []byte("<"))+bytes.Count(def.Raw, []byte(">"))+
				bytes.Count(def.Raw, []byte("&"))+bytes.Count(def.Raw, []byte("\u2028"))+bytes.Count(def.Raw, []byte("\u2029")))
		}
	}
	if tr.ReasoningEffort != "" && tr.ReasoningEffort != "none" {
		needs = append(needs, NeedThinking)
	}
	if tr.Images {
		needs = append(needs, NeedVision)
	}
	return needs, (chars + 3) / 4, nil
}

// CheckTranslatedEmbed checks a translated embeddings request as POST
// /v1/embeddings checks its canonical body (what that body could fail:
// the number of inputs, an empty one, the dimensions' range), from what
// the translation decoded (Inputs, Dimensions) instead of decoding the
// body it generated. Errors are *FieldError, as the route's.
func CheckTranslatedEmbed(tr *translate.Request) error {
	if len(tr.Inputs) > maxInputs {
		return &FieldError{Field: "input", Message: fmt.Sprintf("at most %d items are allowed, got %d", maxInputs, len(tr.Inputs))}
	}
	for i, in := range tr.Inputs {
		if in == "" {
			return &FieldError{Field: fmt.Sprintf("input[%d]", i), Message: "must not be an empty string"}
		}
	}
	if d := tr.Dimensions; d != nil && (*d < 1 || *d > maxDimensions) {
		return &FieldError{Field: "dimensions", Message: fmt.Sprintf("must be an integer between %d and %d, got %d", 1, maxDimensions, *d)}
	}
	return nil
}
