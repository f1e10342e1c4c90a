package apitest

import (
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// The execution paths of a FakeRun.
const (
	Normalized = contract.PathNormalized
	Tunnel     = contract.PathTunnel
)

// Events is a node message of normalized-path events.
func Events(evs ...*nodev1.RunEvent) *nodev1.RunUp {
	return &nodev1.RunUp{Msg: &nodev1.RunUp_Events{Events: &nodev1.RunEvents{Events: evs}}}
}

// Started is the event a run starts with.
func Started() *nodev1.RunEvent {
	return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_STARTED}
}

// Delta is an event of output text.
func Delta(text string) *nodev1.RunEvent {
	return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Text: text}
}

// Usage is a usage event, in tokens.
func Usage(prompt, completion int32) *nodev1.RunEvent {
	return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_USAGE, PromptTokens: prompt, CompletionTokens: completion}
}

// Complete is the end event with a finish reason.
func Complete(finish string) *nodev1.RunEvent {
	return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: finish}
}

// ErrorEvent is a failure event with the provider's status and message.
func ErrorEvent(status int32, msg string) *nodev1.RunEvent {
	return &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Status: status, Error: msg}
}

// TunnelHead is a tunnel answer's status and headers.
func TunnelHead(status int32, headers map[string]string) *nodev1.RunUp {
	return &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: status, Headers: headers}}}
}

// TunnelData is bytes of a tunnel answer's body.
func TunnelData(s string) *nodev1.RunUp {
	return &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelData{TunnelData: &nodev1.TunnelData{Data: []byte(s)}}}
}

// TunnelEnd is the end of a tunnel answer.
func TunnelEnd() *nodev1.RunUp {
	return &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}}
}

// TunnelError is a tunnel answer's failure.
func TunnelError(status int32, msg string) *nodev1.RunUp {
	return &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelError{TunnelError: &nodev1.TunnelError{Status: status, Message: msg}}}
}
