package translate

import (
	"encoding/json"
	"strings"
)

// ResponseEvent is one event of a Responses API stream (OpenAI API
// reference, "Streaming events"): Type is its "type", Data its whole JSON
// object, "type" and "sequence_number" included. It is written as
// "event: <Type>\ndata: <Data>\n\n".
type ResponseEvent struct {
	Type string
	Data []byte
}

// ResponseBuilder turns an answer's deltas (reasoning, text, tool-call
// parts, in the order the provider sent them) into a response's output
// items and, when Emit is set, the Responses stream events that build
// them:
//
//	reasoning   output_item.added (reasoning), reasoning_summary_part.added,
//	            reasoning_summary_text.delta ..., then .done,
//	            reasoning_summary_part.done, output_item.done
//	text        output_item.added (message), content_part.added
//	            (output_text), output_text.delta ..., then
//	            output_text.done, content_part.done, output_item.done
//	tool call   output_item.added (function_call), function_call_arguments
//	            .delta ..., then function_call_arguments.done,
//	            output_item.done
//
// A reasoning or message item is done when an item of another kind
// starts; function calls stay open until Finish (the parts of several
// calls may interleave). Every event gets the next sequence_number, which
// the caller shares for the response's own events (Event). One goroutine
// uses a builder.
type ResponseBuilder struct {
	// NewID returns a new unique id with the given prefix ("msg", "fc",
	// "rs", "call"), such as "msg_<hex>".
	NewID func(prefix string) string
	// Emit receives each event; nil builds the items only.
	Emit func(ResponseEvent) error
	// Seal, when set, makes a reasoning item's encrypted_content of its
	// reasoning text as the item is done (include
	// "reasoning.encrypted_content").
	Seal func(reasoning string) string

	seq   int
	items []*builtItem
	// open message and reasoning item (index into items), -1 for none.
	message, reasoning int
	calls              map[int]int // tool-call index -> items index
	started            bool
}

type builtItem struct {
	item ResponseItem
	text strings.Builder // a message's text, a reasoning item's summary, a call's arguments
	done bool
}

func (b *ResponseBuilder) init() {
	if !b.started {
		b.started, b.message, b.reasoning = true, -1, -1
		b.calls = make(map[int]int)
	}
}

// Event emits an event of the given type with the members of fields (the
// response's own events: response.created, response.completed, ...), with
// the next sequence number.
func (b *ResponseBuilder) Event(typ string, fields map[string]any) error {
	seq := b.seq
	b.seq++
	if b.Emit == nil {
		return nil
	}
	if fields == nil {
		fields = map[string]any{}
	}
	fields["type"], fields["sequence_number"] = typ, seq
	data, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	return b.Emit(ResponseEvent{Type: typ, Data: data})
}

// Thinking adds reasoning text, to the open reasoning item (a new one if
// none is open).
func (b *ResponseBuilder) Thinking(text string) error {
	b.init()
	if text == "" {
		return nil
	}
	if b.reasoning < 0 {
		if err := b.closeMessage("completed"); err != nil {
			return err
		}
		b.reasoning = len(b.items)
		it := &builtItem{item: ResponseItem{Type: ItemReasoning, ID: b.NewID("rs")}}
		b.items = append(b.items, it)
		if err := b.Event("response.output_item.added", map[string]any{"output_index": b.reasoning, "item": it.item}); err != nil {
			return err
		}
		if err := b.Event("response.reasoning_summary_part.added", map[string]any{"item_id": it.item.ID, "output_index": b.reasoning,
			"summary_index": 0, "part": ResponsePart{Type: PartSummaryText}}); err != nil {
			return err
		}
	}
	it := b.items[b.reasoning]
	it.text.WriteString(text)
	return b.Event("response.reasoning_summary_text.delta", map[string]any{"item_id": it.item.ID, "output_index": b.reasoning,
		"summary_index": 0, "delta": text})
}

// Text adds answer text, to the open message (a new one if none is open).
func (b *ResponseBuilder) Text(text string) error {
	b.init()
	if text == "" {
		return nil
	}
	if b.message < 0 {
		if err := b.closeReasoning("completed"); err != nil {
			return err
		}
		b.message = len(b.items)
		it := &builtItem{item: ResponseItem{Type: ItemMessage, ID: b.NewID("msg"), Status: "in_progress", Role: "assistant"}}
		b.items = append(b.items, it)
		if err := b.Event("response.output_item.added", map[string]any{"output_index": b.message, "item": it.item}); err != nil {
			return err
		}
		if err := b.Event("response.content_part.added", map[string]any{"item_id": it.item.ID, "output_index": b.message,
			"content_index": 0, "part": ResponsePart{Type: PartOutputText}}); err != nil {
			return err
		}
	}
	it := b.items[b.message]
	it.text.WriteString(text)
	return b.Event("response.output_text.delta", map[string]any{"item_id": it.item.ID, "output_index": b.message,
		"content_index": 0, "delta": text, "logprobs": []any{}})
}

// ToolCall adds one part of the tool call at index (the provider's
// index): its first part opens a function_call item (call_id the
// provider's id, or a new "call_…" one), each part's arguments are
// appended.
func (b *ResponseBuilder) ToolCall(index int, id, name, arguments string) error {
	b.init()
	i, ok := b.calls[index]
	if !ok {
		if err := b.closeReasoning("completed"); err != nil {
			return err
		}
		if err := b.closeMessage("completed"); err != nil {
			return err
		}
		if id == "" {
			id = b.NewID("call")
		}
		i = len(b.items)
		b.calls[index] = i
		it := &builtItem{item: ResponseItem{Type: ItemFunctionCall, ID: b.NewID("fc"), Status: "in_progress", CallID: id, Name: name}}
		b.items = append(b.items, it)
		if err := b.Event("response.output_item.added", map[string]any{"output_index": i, "item": it.item}); err != nil {
			return err
		}
	}
	it := b.items[i]
	if it.item.Name == "" {
		it.item.Name = name
	}
	if arguments == "" {
		return nil
	}
	it.text.WriteString(arguments)
	return b.Event("response.function_call_arguments.delta", map[string]any{"item_id": it.item.ID, "output_index": i, "delta": arguments})
}

// Finish ends every open item with status ("completed", or "incomplete"
// for an answer cut short), emitting their done events, in output order.
func (b *ResponseBuilder) Finish(status string) error {
	b.init()
	if err := b.closeReasoning(status); err != nil {
		return err
	}
	if err := b.closeMessage(status); err != nil {
		return err
	}
	for i, it := range b.items {
		if it.item.Type != ItemFunctionCall || it.done {
			continue
		}
		it.done = true
		it.item.Status, it.item.Arguments = status, it.text.String()
		if err := b.Event("response.function_call_arguments.done", map[string]any{"item_id": it.item.ID, "output_index": i,
			"name": it.item.Name, "arguments": it.item.Arguments}); err != nil {
			return err
		}
		if err := b.Event("response.output_item.done", map[string]any{"output_index": i, "item": it.item}); err != nil {
			return err
		}
	}
	return nil
}

func (b *ResponseBuilder) closeMessage(status string) error {
	if b.message < 0 {
		return nil
	}
	i := b.message
	b.message = -1
	it := b.items[i]
	it.done = true
	part := ResponsePart{Type: PartOutputText, Text: it.text.String()}
	it.item.Status, it.item.Content = status, []ResponsePart{part}
	if err := b.Event("response.output_text.done", map[string]any{"item_id": it.item.ID, "output_index": i,
		"content_index": 0, "text": part.Text, "logprobs": []any{}}); err != nil {
		return err
	}
	if err := b.Event("response.content_part.done", map[string]any{"item_id": it.item.ID, "output_index": i,
		"content_index": 0, "part": part}); err != nil {
		return err
	}
	return b.Event("response.output_item.done", map[string]any{"output_index": i, "item": it.item})
}

func (b *ResponseBuilder) closeReasoning(status string) error {
	if b.reasoning < 0 {
		return nil
	}
	i := b.reasoning
	b.reasoning = -1
	it := b.items[i]
	it.done = true
	part := ResponsePart{Type: PartSummaryText, Text: it.text.String()}
	it.item.Summary = []ResponsePart{part}
	if b.Seal != nil {
		it.item.EncryptedContent = b.Seal(part.Text)
	}
	_ = status // a reasoning item has no status in OpenAI's output
	if err := b.Event("response.reasoning_summary_text.done", map[string]any{"item_id": it.item.ID, "output_index": i,
		"summary_index": 0, "text": part.Text}); err != nil {
		return err
	}
	if err := b.Event("response.reasoning_summary_part.done", map[string]any{"item_id": it.item.ID, "output_index": i,
		"summary_index": 0, "part": part}); err != nil {
		return err
	}
	return b.Event("response.output_item.done", map[string]any{"output_index": i, "item": it.item})
}

// Output returns the output items built so far, in order; an item not
// finished yet (a failed answer's) has its text so far and status
// "incomplete".
func (b *ResponseBuilder) Output() []ResponseItem {
	out := make([]ResponseItem, 0, len(b.items))
	for _, it := range b.items {
		item := it.item
		if !it.done {
			switch item.Type {
			case ItemMessage:
				item.Content = []ResponsePart{{Type: PartOutputText, Text: it.text.String()}}
				item.Status = "incomplete"
			case ItemReasoning:
				item.Summary = []ResponsePart{{Type: PartSummaryText, Text: it.text.String()}}
			case ItemFunctionCall:
				item.Arguments, item.Status = it.text.String(), "incomplete"
			}
		}
		out = append(out, item)
	}
	return out
}

// OutputText is the text of the output's messages, joined (the SDKs'
// output_text).
func OutputText(items []ResponseItem) string {
	var b strings.Builder
	for _, it := range items {
		if it.Type != ItemMessage {
			continue
		}
		for _, p := range it.Content {
			if p.Type == PartOutputText {
				b.WriteString(p.Text)
			}
		}
	}
	return b.String()
}

// ResponseStatus maps a chat answer's finish reason to a response's
// status and incomplete_details reason: "length" is incomplete
// (max_output_tokens), "content_filter" incomplete (content_filter),
// anything else completed.
func ResponseStatus(finish string) (status, incompleteReason string) {
	switch finish {
	case "length":
		return "incomplete", "max_output_tokens"
	case "content_filter":
		return "incomplete", "content_filter"
	}
	return "completed", ""
}
