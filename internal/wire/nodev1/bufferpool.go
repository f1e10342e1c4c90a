package nodev1

import (
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// BufferPool is the gRPC buffer pool of the edge ↔ node link, on both
// ends: a tier at every power of two from 256 B to 1 MiB (larger buffers
// are allocated to fit). gRPC's default pool has no tier between 32 KiB
// and 1 MiB, so every message between them (an agent's request body, 30–
// 200 KB, goes down in one message) took, zeroed and kept in the pool a
// 1 MiB buffer; here it takes at most twice its size. The edge's server
// and the node's client use it for their transports' reads
// (experimental.BufferPool, experimental.WithBufferPool) and, through
// Codec, for marshalling and unmarshalling.
var BufferPool = mustBufferPool(mem.NewBinaryTieredBufferPool(8, 12, 14, 15, 16, 17, 18, 19, 20))

func mustBufferPool(p mem.BufferPool, err error) mem.BufferPool {
	if err != nil {
		panic(err) // the exponents above are valid on every platform
	}
	return p
}

// Codec is gRPC's protobuf codec ("proto") taking its buffers from
// BufferPool instead of gRPC's default pool; the edge forces it on its
// node server (grpc.ForceServerCodecV2), the node on its calls
// (grpc.ForceCodecV2). The bytes on the wire are the same.
var Codec codec

type codec struct{}

// Name is the content subtype, the same as gRPC's own protobuf codec.
func (codec) Name() string { return "proto" }

// Marshal encodes v, a protobuf message, into one buffer: from BufferPool
// above gRPC's pooling threshold, else a plain allocation.
func (codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("proto: cannot marshal %T, not a proto.Message", v)
	}
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true} // the Size just above
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := BufferPool.Get(size)
	if _, err := opts.MarshalAppend((*buf)[:0], m); err != nil {
		BufferPool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, BufferPool)}, nil
}

// Unmarshal decodes data into v, a protobuf message; v keeps no reference
// to data's buffers.
func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("proto: cannot unmarshal into %T, not a proto.Message", v)
	}
	buf := data.MaterializeToBuffer(BufferPool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}
