package nodev1

import (
	"bytes"
	"runtime"
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Codec's bytes are gRPC's protobuf codec's, below and above the pooling
// threshold, and decode back to the message.
func TestCodecMatchesProtoCodec(t *testing.T) {
	std := encoding.GetCodecV2("proto")
	for _, n := range []int{0, 10, 100 << 10, 3 << 20} {
		m := &RunDown{Msg: &RunDown_Body{Body: &Body{Data: bytes.Repeat([]byte{'x'}, n), Last: true}}}
		got, err := Codec.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		want, err := std.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Materialize(), want.Materialize()) {
			t.Errorf("%d bytes: the codecs' encodings differ", n)
		}
		var back RunDown
		if err := Codec.Unmarshal(got, &back); err != nil {
			t.Fatal(err)
		}
		got.Free()
		want.Free()
		if !proto.Equal(&back, m) {
			t.Errorf("%d bytes: decoded message differs", n)
		}
	}
	if err := Codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{1})}, "not a message"); err == nil {
		t.Error("Unmarshal into a string: no error")
	}
}

// gRPC's default buffer pool has no tier between 32 KiB and 1 MiB: each
// 100 KB request body sent down the node link took a zeroed 1 MiB buffer,
// and the edge's pool kept about ten of them (heap profiles of the peers
// benchmark: 10 MiB of the edge's 13 MiB live heap). Codec takes a buffer
// at most twice the message's size.
func TestRegression_LargeMessageTakesNoMebibyteBuffer(t *testing.T) {
	m := &RunDown{Msg: &RunDown_Body{Body: &Body{Data: bytes.Repeat([]byte{'x'}, 100_000), Last: true}}}
	allocated := func(c encoding.CodecV2) uint64 {
		var before, after runtime.MemStats
		runtime.GC() // empties the pools (a second GC clears their victims)
		runtime.GC()
		runtime.ReadMemStats(&before)
		b, err := c.Marshal(m)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		b.Free()
		return after.TotalAlloc - before.TotalAlloc
	}
	if got := allocated(encoding.GetCodecV2("proto")); got < 1<<20 {
		t.Logf("gRPC's own codec allocated %d bytes for a 100 KB message (it took 1 MiB when this test was written)", got)
	}
	if got := allocated(Codec); got > 2*100_000+4096 {
		t.Fatalf("Codec allocated %d bytes to marshal a 100 KB message, want at most twice its size", got)
	}
}
