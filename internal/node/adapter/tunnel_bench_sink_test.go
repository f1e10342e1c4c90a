package adapter

import (
	"strings"

	"google.golang.org/protobuf/proto"

	"iop/internal/wire/nodev1"
)

// wireSink is a TunnelSink that marshals each message as the node's
// tunnelSink sends it (node/run.go) and gRPC marshals it, and counts the
// messages and body bytes.
type wireSink struct {
	buf        []byte
	msgs, body int
	ended      bool
}

func (s *wireSink) reset() { s.msgs, s.body, s.ended = 0, 0, false }

func (s *wireSink) send(m *nodev1.RunUp) error {
	var err error
	s.buf, err = proto.MarshalOptions{}.MarshalAppend(s.buf[:0], m)
	s.msgs++
	return err
}

func (s *wireSink) Head(h TunnelHead) error {
	headers := make(map[string]string, len(h.Header))
	for k, vs := range h.Header {
		headers[k] = strings.Join(vs, ", ")
	}
	s.body += len(h.Body)
	s.ended = h.End
	return s.send(&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: int32(h.Status), Headers: headers, Data: h.Body, End: h.End}}})
}

func (s *wireSink) Data(p []byte) error {
	s.body += len(p)
	return s.send(&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelData{TunnelData: &nodev1.TunnelData{Data: p}}})
}

// finish sends the TunnelEnd serveRun sends after a clean answer whose head
// did not carry its end.
func (s *wireSink) finish() {
	if !s.ended {
		_ = s.send(&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}})
	}
}
