package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"
	"time"

	"iop/internal/wire/nodev1"
)

// showTimeout bounds one /api/show the edge asks for (ShowRequest).
const showTimeout = 10 * time.Second

// maxShowBytes caps one /api/show answer passed to the edge (a verbose one
// lists every token of the vocabulary: a few MB for large models).
const maxShowBytes = 64 << 20

// showChunk is the largest part of an /api/show answer in one ShowAnswer,
// so heartbeats pass between the parts on the control stream.
const showChunk = 1 << 20

// maxShows bounds the ShowRequests one connection serves at once; more
// are answered at once with an error (the edge answers its client 503).
const maxShows = 4

// errShowBusy: maxShows are being served on the connection.
var errShowBusy = errors.New("too many /api/show requests at once")

// ollamaMeta asks an Ollama provider's server what it says of its models
// and holds loaded: POST /api/show, GET /api/ps. It is safe for
// concurrent use.
type ollamaMeta struct {
	baseURL string // as configured, without a trailing slash
	apiKey  string // sent as a bearer token when set
	client  *http.Client
}

func newOllamaMeta(pc ProviderConfig, apiKey string) *ollamaMeta {
	return &ollamaMeta{
		baseURL: strings.TrimSuffix(pc.BaseURL, "/"),
		apiKey:  apiKey,
		client:  &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 2}},
	}
}

func (m *ollamaMeta) close() { m.client.CloseIdleConnections() }

// get sends one request and returns the answer's status and body, at
// most limit bytes (more is an error).
func (m *ollamaMeta) get(ctx context.Context, method, p string, body []byte, limit int64) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, m.baseURL+p, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Accept-Encoding", "identity")
	if m.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+m.apiKey)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: reading the answer: %w", method, p, err)
	}
	if int64(len(data)) > limit {
		return 0, nil, fmt.Errorf("%s %s: answer over %d bytes", method, p, limit)
	}
	return resp.StatusCode, data, nil
}

// show asks the server POST /api/show for model and returns its status
// and body, with the host's paths removed from a 200 answer (scrubShow).
func (m *ollamaMeta) show(ctx context.Context, model string, verbose bool) (int, []byte, error) {
	in := map[string]any{"model": model}
	if verbose {
		in["verbose"] = true
	}
	body, _ := json.Marshal(in)
	ctx, cancel := context.WithTimeout(ctx, showTimeout)
	defer cancel()
	status, data, err := m.get(ctx, http.MethodPost, "/api/show", body, maxShowBytes)
	if err != nil || status != http.StatusOK {
		return status, data, err
	}
	data, err = scrubShow(data, model)
	if err != nil {
		return 0, nil, fmt.Errorf("POST /api/show: %w", err)
	}
	return status, data, nil
}

// serveShow answers a ShowRequest from the edge on its own goroutine
// (at most maxShows at once per connection): the provider's /api/show
// answer in ShowAnswer parts, or one ShowAnswer with an error (unknown
// provider, one that is not an Ollama, a server that did not answer).
func (c *conn) serveShow(req *nodev1.ShowRequest) {
	p := c.a.providers[req.GetProviderId()]
	var refused error
	switch {
	case p == nil:
		refused = fmt.Errorf("%w %q", ErrUnknownProvider, req.GetProviderId())
	case p.meta == nil:
		refused = fmt.Errorf("provider %q is not an Ollama: it has no /api/show", req.GetProviderId())
	}
	if refused == nil {
		select {
		case c.shows <- struct{}{}:
		default:
			refused = errShowBusy
		}
	}
	if refused != nil {
		c.sendShow(&nodev1.ShowAnswer{RequestId: req.GetRequestId(), Last: true, Error: refused.Error()})
		return
	}
	c.auxWG.Go(func() {
		defer func() { <-c.shows }()
		status, data, err := p.meta.show(c.ctx, req.GetModel(), req.GetVerbose())
		if err != nil {
			c.a.logger.Warn("/api/show for the edge failed", "provider", p.cfg.ID, "model", req.GetModel(), "err", err)
			c.sendShow(&nodev1.ShowAnswer{RequestId: req.GetRequestId(), Last: true, Error: "the provider's model server did not answer /api/show"})
			return
		}
		for {
			n := min(len(data), showChunk)
			last := n == len(data)
			if !c.sendShow(&nodev1.ShowAnswer{RequestId: req.GetRequestId(), Status: int32(status), Data: data[:n], Last: last}) || last {
				return
			}
			data = data[n:]
		}
	})
}

// sendShow queues a for the control stream; false when the connection
// ended first.
func (c *conn) sendShow(a *nodev1.ShowAnswer) bool {
	select {
	case c.out <- &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ShowAnswer{ShowAnswer: a}}:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// scrubShow removes paths of the provider's host from an Ollama /api/show
// answer, leaving every other byte as the server wrote it (the members'
// order and number formats too):
//   - "modelfile": the argument of a FROM or ADAPTER line that is a file
//     path ("FROM /root/.ollama/models/blobs/sha256-…") becomes, on the
//     first FROM line, model (what the modelfile's own comment says to
//     write there), elsewhere the file's base name (the blob's digest);
//   - "details"."parent_model" that is a file path becomes "", as
//     Ollama's own /api/tags says it.
//
// Ollama writes no path elsewhere in the answer. Errors: the body is not a
// JSON object.
func scrubShow(body []byte, model string) ([]byte, error) {
	members, err := objectMembers(body)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			out.WriteByte(',')
		}
		out.Write(m.key)
		out.WriteByte(':')
		value := m.value
		switch string(m.key) {
		case `"modelfile"`:
			var mf string
			if json.Unmarshal(value, &mf) == nil {
				value = marshalString(scrubModelfile(mf, model))
			}
		case `"details"`:
			value = scrubParentModel(value)
		}
		out.Write(value)
	}
	out.WriteByte('}')
	out.Write(body[len(bytes.TrimRight(body, " \t\r\n")):]) // a final newline, as written
	return out.Bytes(), nil
}

// member is one member of a JSON object, its key and value as written.
type member struct{ key, value []byte }

// objectMembers splits a JSON object into its members, in order.
func objectMembers(body []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}
	var out []member
	for dec.More() {
		start := dec.InputOffset()
		if _, err := dec.Token(); err != nil {
			return nil, err
		}
		key := bytes.TrimLeft(body[start:dec.InputOffset()], " \t\r\n,")
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, err
		}
		out = append(out, member{key: key, value: value})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	return out, nil
}

// scrubModelfile replaces the file-path arguments of FROM and ADAPTER
// lines (see scrubShow).
func scrubModelfile(mf, model string) string {
	lines := strings.Split(mf, "\n")
	first := true
	for i, line := range lines {
		cmd, arg, ok := strings.Cut(line, " ")
		if !ok || (cmd != "FROM" && cmd != "ADAPTER") {
			continue
		}
		wasFrom := cmd == "FROM" && first
		if cmd == "FROM" {
			first = false
		}
		if !isFilePath(arg) {
			continue
		}
		if wasFrom {
			lines[i] = cmd + " " + model
		} else {
			lines[i] = cmd + " " + path.Base(strings.ReplaceAll(arg, `\`, "/"))
		}
	}
	return strings.Join(lines, "\n")
}

// scrubParentModel returns details with a parent_model that is a file
// path set to "", else details unchanged.
func scrubParentModel(details []byte) []byte {
	members, err := objectMembers(details)
	if err != nil {
		return details
	}
	var out bytes.Buffer
	out.WriteByte('{')
	changed := false
	for i, m := range members {
		if i > 0 {
			out.WriteByte(',')
		}
		out.Write(m.key)
		out.WriteByte(':')
		var s string
		if string(m.key) == `"parent_model"` && json.Unmarshal(m.value, &s) == nil && isFilePath(s) {
			out.WriteString(`""`)
			changed = true
			continue
		}
		out.Write(m.value)
	}
	out.WriteByte('}')
	if !changed {
		return details
	}
	return out.Bytes()
}

// marshalString writes s as a JSON string, with <, > and & escaped as
// Go's encoding/json (and so Ollama) escapes them.
func marshalString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}
