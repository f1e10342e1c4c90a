package translate

import (
	"encoding/json"
	"fmt"
)

// Item types of the Responses API (OpenAI API reference, "Responses",
// the input and output item objects) that iop reads and writes.
const (
	ItemMessage            = "message"
	ItemFunctionCall       = "function_call"
	ItemFunctionCallOutput = "function_call_output"
	ItemReasoning          = "reasoning"
	// ItemReference is an input item that names an earlier item by id
	// ({"type":"item_reference","id"}): the caller resolves it against its
	// stored items (ResponsesRequest.Resolve) before it is translated.
	ItemReference = "item_reference"
)

// Content part types of Responses items.
const (
	PartInputText   = "input_text"
	PartInputImage  = "input_image"
	PartOutputText  = "output_text"
	PartRefusal     = "refusal"
	PartSummaryText = "summary_text"
	// PartReasoningText is a reasoning item's content part: accepted in
	// input (dropped from the chat), never written.
	PartReasoningText = "reasoning_text"
)

// ResponseItem is one item of a response's input or output (OpenAI API
// reference, Responses "input items" and "output"): a message, a function
// call, a function call's output, a reasoning item or an item reference.
// Which fields are set depends on Type; MarshalJSON writes each type in the
// API's shape, with the members the official clients require (a message's
// content, an output_text part's annotations, a reasoning item's summary,
// a function call's arguments) present even when empty.
type ResponseItem struct {
	Type string
	// ID is the item's id ("msg_…", "fc_…", "rs_…"; the referenced id of an
	// item_reference); "" in an input item that had none.
	ID string
	// Status is "in_progress", "completed" or "incomplete"; "" for none.
	Status string
	// Role is a message's: user, system, developer or assistant.
	Role string
	// Content is a message's parts (input_text, input_image, output_text,
	// refusal) or a reasoning item's (reasoning_text).
	Content []ResponsePart
	// CallID, Name and Arguments (JSON text) are a function call's; CallID
	// is also a function call output's.
	CallID, Name, Arguments string
	// Output is a function call output's "output": a JSON string or an
	// array of input_text / input_image parts, as sent.
	Output json.RawMessage
	// Summary is a reasoning item's summary_text parts.
	Summary []ResponsePart
	// EncryptedContent is a reasoning item's "encrypted_content": an
	// opaque token of its reasoning, written when the request's include
	// asks for it (ResponseBuilder.Seal) and read back from input.
	EncryptedContent string
}

// ResponsePart is one content part of a ResponseItem.
type ResponsePart struct {
	Type string
	// Text is the text of input_text, output_text, summary_text and
	// reasoning_text parts.
	Text string
	// ImageURL is an input_image's URL (a data: URL or http(s)); FileID
	// its file id (refused: iop has no files API); Detail its detail
	// ("auto" when not given).
	ImageURL, FileID, Detail string
	// Refusal is a refusal part's text.
	Refusal string
}

// MarshalJSON writes the item in the Responses API's shape.
func (it ResponseItem) MarshalJSON() ([]byte, error) {
	parts := func(ps []ResponsePart) []ResponsePart {
		if ps == nil {
			return []ResponsePart{}
		}
		return ps
	}
	switch it.Type {
	case ItemMessage:
		return json.Marshal(struct {
			Type    string         `json:"type"`
			ID      string         `json:"id,omitempty"`
			Status  string         `json:"status,omitempty"`
			Role    string         `json:"role"`
			Content []ResponsePart `json:"content"`
		}{it.Type, it.ID, it.Status, it.Role, parts(it.Content)})
	case ItemFunctionCall:
		return json.Marshal(struct {
			Type      string `json:"type"`
			ID        string `json:"id,omitempty"`
			Status    string `json:"status,omitempty"`
			CallID    string `json:"call_id"`
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		}{it.Type, it.ID, it.Status, it.CallID, it.Name, it.Arguments})
	case ItemFunctionCallOutput:
		out := it.Output
		if len(out) == 0 {
			out = json.RawMessage(`""`)
		}
		return json.Marshal(struct {
			Type   string          `json:"type"`
			ID     string          `json:"id,omitempty"`
			Status string          `json:"status,omitempty"`
			CallID string          `json:"call_id"`
			Output json.RawMessage `json:"output"`
		}{it.Type, it.ID, it.Status, it.CallID, out})
	case ItemReasoning:
		return json.Marshal(struct {
			Type             string         `json:"type"`
			ID               string         `json:"id,omitempty"`
			Status           string         `json:"status,omitempty"`
			Summary          []ResponsePart `json:"summary"`
			Content          []ResponsePart `json:"content,omitempty"`
			EncryptedContent string         `json:"encrypted_content,omitempty"`
		}{it.Type, it.ID, it.Status, parts(it.Summary), it.Content, it.EncryptedContent})
	case ItemReference:
		return json.Marshal(struct {
			Type string `json:"type"`
			ID   string `json:"id"`
		}{it.Type, it.ID})
	}
	return nil, fmt.Errorf("translate: no JSON shape for a response item of type %q", it.Type)
}

// UnmarshalJSON reads an item as MarshalJSON writes it (a stored item);
// it checks nothing a client sent (DecodeResponsesRequest does).
func (it *ResponseItem) UnmarshalJSON(b []byte) error {
	item, err := decodeItem(b, "item")
	if err != nil {
		return err
	}
	*it = item
	return nil
}

// MarshalJSON writes the part in the Responses API's shape.
func (p ResponsePart) MarshalJSON() ([]byte, error) {
	switch p.Type {
	case PartInputText, PartSummaryText, PartReasoningText:
		return json.Marshal(struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}{p.Type, p.Text})
	case PartOutputText:
		return json.Marshal(struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			Annotations []any  `json:"annotations"`
			Logprobs    []any  `json:"logprobs"`
		}{p.Type, p.Text, []any{}, []any{}})
	case PartRefusal:
		return json.Marshal(struct {
			Type    string `json:"type"`
			Refusal string `json:"refusal"`
		}{p.Type, p.Refusal})
	case PartInputImage:
		detail := p.Detail
		if detail == "" {
			detail = "auto"
		}
		return json.Marshal(struct {
			Type     string `json:"type"`
			ImageURL string `json:"image_url,omitempty"`
			FileID   string `json:"file_id,omitempty"`
			Detail   string `json:"detail"`
		}{p.Type, p.ImageURL, p.FileID, detail})
	}
	return nil, fmt.Errorf("translate: no JSON shape for a content part of type %q", p.Type)
}
