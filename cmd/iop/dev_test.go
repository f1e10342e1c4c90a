package main

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
)

// TestDevDemoAnswersEmbeddings: the simulated providers of `iop dev`
// declare capability embeddings, so the alias demo answers embedding
// requests (on whichever of its providers is least loaded).
func TestDevDemoAnswersEmbeddings(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	d, err := startDev(ctx, devConfig{Listen: "127.0.0.1:0", NodeListen: "127.0.0.1:0", ForceSim: true, SimCapacity: 2}, quietLogger())
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := d.Wait(); err != nil {
			t.Errorf("iop dev: %v", err)
		}
	}()
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	for _, model := range append([]string{devAlias}, d.Models...) {
		status, body := postTo(t, c, "http://"+d.Edge.HTTPAddr+"/v1/embeddings", `{"model":"`+model+`","input":["a","b c"]}`)
		var got struct {
			Data []struct {
				Embedding []float32 `json:"embedding"`
			} `json:"data"`
		}
		if status != http.StatusOK || json.Unmarshal(body, &got) != nil || len(got.Data) != 2 || len(got.Data[1].Embedding) == 0 {
			t.Fatalf("%s: %d %s", model, status, body)
		}
	}
}
