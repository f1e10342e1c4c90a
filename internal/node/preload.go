package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"iop/internal/node/managed"
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
// model (an Ollama: ollamaMeta.keep; a managed provider: its server
// started or stopped, managed.Manager.Load and Unload), then the
// provider's loaded models are read again (kickResidency; a managed
// provider reports its own), and one ResidencyAnswer says how it went. A
// provider that is unknown, or whose server holds its models always, is
// refused at once.
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
	if p == nil {
		answer(fmt.Errorf("%w %q", ErrUnknownProvider, req.GetProviderId()))
		return
	}
	m, isManaged := p.adapter.(*managed.Manager)
	if p.meta == nil && !isManaged {
		answer(fmt.Errorf("provider %q holds its models always", req.GetProviderId()))
		return
	}
	c.auxWG.Go(func() {
		var err error
		switch {
		case isManaged && req.GetUnload():
			err = m.Unload(req.GetModel())
		case isManaged:
			ctx, cancel := context.WithTimeout(c.ctx, keepTimeout)
			err = m.Load(ctx, req.GetModel())
			cancel()
		default:
			err = p.meta.keep(c.ctx, req.GetModel(), req.GetUnload())
		}
		if err != nil {
			c.a.logger.Warn("load or unload for the edge failed", "provider", p.cfg.ID, "model", req.GetModel(),
				"unload", req.GetUnload(), "err", err)
			err = keepError(err)
		}
		c.a.kickResidency(p.cfg.ID)
		answer(err)
	})
}

// keepError is what the edge is told of a failed load or unload: a
// server's refusal or a managed server's state as it is; anything else
// (a transport error names the server's address, a start failure its
// command) in general words.
func keepError(err error) error {
	if _, refused := errors.AsType[*keepRefused](err); refused {
		return err
	}
	for _, known := range []error{managed.ErrBusy, managed.ErrUnknownModel, managed.ErrStartFailed, managed.ErrStartTimeout, managed.ErrExited} {
		if errors.Is(err, known) {
			return known
		}
	}
	return errors.New("the provider's model server did not answer")
}
