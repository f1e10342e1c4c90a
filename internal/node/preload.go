package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"iop/internal/wire/nodev1"
)

// keepTimeout bounds one load or unload the edge asks for
// (ResidencyRequest): loading a large model takes minutes.
const keepTimeout = 5 * time.Minute

// maxKeepBytes caps the server's answer to a load or unload.
const maxKeepBytes = 1 << 20

// keep asks the server to load model and keep it loaded (keep_alive -1),
// or with unload to unload it (keep_alive 0): Ollama's POST /api/generate
// with the model and no prompt, which answers once the model is loaded
// (done_reason "load") or unloaded ("unload"). Errors: the server did not
// answer, or answered a status other than 200 (with its error message).
func (m *ollamaMeta) keep(ctx context.Context, model string, unload bool) error {
	keepAlive := -1
	if unload {
		keepAlive = 0
	}
	body, _ := json.Marshal(map[string]any{"model": model, "keep_alive": keepAlive, "stream": false})
	ctx, cancel := context.WithTimeout(ctx, keepTimeout)
	defer cancel()
	status, data, err := m.get(ctx, http.MethodPost, "/api/generate", body, maxKeepBytes)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		return &keepRefused{status: status, message: e.Error}
	}
	return nil
}

// keepRefused is a server's refusal of a load or unload.
type keepRefused struct {
	status  int
	message string
}

func (e *keepRefused) Error() string {
	return fmt.Sprintf("the provider's model server answered %d: %s", e.status, e.message)
}

// serveResidency answers a ResidencyRequest from the edge on its own
// goroutine (conn.auxWG): the provider's server loads or unloads the
// model (ollamaMeta.keep), then the provider's loaded models are read
// again (kickResidency), and one ResidencyAnswer says how it went. A
// provider that is unknown or not an Ollama is refused at once.
func (c *conn) serveResidency(req *nodev1.ResidencyRequest) {
	answer := func(err error) {
		a := &nodev1.ResidencyAnswer{RequestId: req.GetRequestId()}
		if err != nil {
			a.Error = err.Error()
		}
		select {
		case c.out <- &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ResidencyAnswer{ResidencyAnswer: a}}:
		case <-c.ctx.Done():
		}
	}
	p := c.a.providers[req.GetProviderId()]
	switch {
	case p == nil:
		answer(fmt.Errorf("%w %q", ErrUnknownProvider, req.GetProviderId()))
		return
	case p.meta == nil:
		answer(fmt.Errorf("provider %q is not an Ollama: its server holds its models always", req.GetProviderId()))
		return
	}
	c.auxWG.Go(func() {
		err := p.meta.keep(c.ctx, req.GetModel(), req.GetUnload())
		if err != nil {
			c.a.logger.Warn("load or unload for the edge failed", "provider", p.cfg.ID, "model", req.GetModel(),
				"unload", req.GetUnload(), "err", err)
			if _, refused := errors.AsType[*keepRefused](err); !refused {
				// A transport error names the server's address: not for the edge.
				err = errors.New("the provider's model server did not answer")
			}
		}
		c.a.kickResidency(p.cfg.ID)
		answer(err)
	})
}
