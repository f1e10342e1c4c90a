package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/process"
	"iop/internal/testenv"
)

// TestRegression_UploadStalledReleasesTheSlot: a client over a real TCP
// connection sends a transcription's headers (Content-Length 8 MiB) and
// 256 KiB of its multipart body, model first, then nothing, the
// connection open. Its run held the provider's slot for the body's whole
// read timeout (10 minutes); with upload_idle_timeout 2s the client is
// answered 408 once the body pauses that long, and the slot is released.
func TestRegression_UploadStalledReleasesTheSlot(t *testing.T) {
	harness.Parallel(t)
	rig := newMediaRig(t, 0, func(c *process.EdgeFile) { c.UploadIdleTimeout = 2 * time.Second })
	var part bytes.Buffer
	mw := multipart.NewWriter(&part)
	if err := mw.WriteField("model", "m"); err != nil {
		t.Fatal(err)
	}
	fw, err := mw.CreateFormFile("file", "a.wav")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(fw, newPattern(), 256<<10); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", rig.e.HTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	head := fmt.Sprintf("POST /v1/audio/transcriptions HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n",
		rig.e.HTTPAddr, mw.FormDataContentType(), 8<<20)
	if _, err := conn.Write(append([]byte(head), part.Bytes()...)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the stalled upload's run holds its slot", func() bool {
		for _, p := range rig.e.Service.Snapshot().Providers {
			if p.ProviderID == "p" && p.InFlight == 1 {
				return true
			}
		}
		return false
	})
	_ = conn.SetReadDeadline(time.Now().Add(60 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to the stalled upload: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("the stalled upload was answered %d %s, want 408", resp.StatusCode, body)
	}
	waitIdle(t, rig.e)
}
