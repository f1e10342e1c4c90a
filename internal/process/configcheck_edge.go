package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"iop/internal/edge/adminwire"
	"iop/internal/modelname"
	"iop/internal/node"
)

// ErrEdgeAdmin is an edge whose admin API did not answer GET
// /admin/v1/queues with its queues (unreachable, refused the key, not an
// edge).
var ErrEdgeAdmin = errors.New("edge admin API")

// advertised is one provider's served models as the node would advertise
// them; err is set when its server could not be asked (discovery).
type advertised struct {
	id     string
	models []string
	err    error
}

// CheckNodeAgainstEdge compares what the node of the config file data
// (which CheckConfig found valid) would advertise with what the aliases of
// the edge at base target, read from its admin API (GET /admin/v1/queues
// with client, which carries the admin key). A provider with models
// advertises them; one without discovers them once from its server, as the
// agent would (node.Discover). Names match by one rule (package modelname:
// "x" is "x:latest").
//
// It returns one line per fact, in config words: each provider's models;
// per alias, which targets this node serves (and as what) and which
// neither it nor any node of the edge serves; the node's models no alias
// targets. warnings counts the lines that point at a likely mistake: an
// alias target that neither this node nor any node of the edge serves, a
// provider whose server could not be read. Errors: ErrEdgeAdmin, or the
// file's decoding error.
func CheckNodeAgainstEdge(ctx context.Context, client *http.Client, base string, data []byte) (lines []string, warnings int, err error) {
	var cfg node.Config
	if err := decodeYAMLStrict(data, &cfg); err != nil {
		return nil, 0, err
	}
	cfg = cfg.WithDefaults()
	queues, err := edgeQueues(ctx, client, base)
	if err != nil {
		return nil, 0, err
	}
	var provs []advertised
	for _, pc := range cfg.Providers {
		a := advertised{id: pc.ID, models: slices.Clone(pc.Models)}
		if pc.Discovers() {
			found, err := node.Discover(ctx, pc)
			a.err = err
			for _, m := range found {
				a.models = append(a.models, m.Name)
			}
		}
		slices.Sort(a.models)
		provs = append(provs, a)
		switch {
		case a.err != nil:
			warnings++
			lines = append(lines, fmt.Sprintf("warning: provider %s: its models could not be read from its server (%v); the node would join with it out of rotation", a.id, a.err))
		case len(a.models) == 0:
			warnings++
			lines = append(lines, fmt.Sprintf("warning: provider %s advertises no model", a.id))
		default:
			lines = append(lines, fmt.Sprintf("provider %s advertises %s", a.id, strings.Join(a.models, ", ")))
		}
	}
	// servedBy names the providers of this node serving m, with their own
	// spelling when it differs.
	servedBy := func(m string) []string {
		var out []string
		for _, a := range provs {
			for _, s := range a.models {
				if modelname.Same(s, m) {
					if s == m {
						out = append(out, "provider "+a.id)
					} else {
						out = append(out, fmt.Sprintf("provider %s (as %s)", a.id, s))
					}
				}
			}
		}
		return out
	}
	targeted := make(map[string][]string) // a node model → the aliases targeting it
	for _, q := range queues {
		if q.Targets == nil {
			continue // a served name's queue, no alias
		}
		var parts []string
		for _, t := range q.Targets {
			by := servedBy(t)
			for _, a := range provs {
				for _, s := range a.models {
					if modelname.Same(s, t) && !slices.Contains(targeted[s], q.Model) {
						targeted[s] = append(targeted[s], q.Model)
					}
				}
			}
			switch {
			case len(by) > 0:
				parts = append(parts, t+" by "+strings.Join(by, ", "))
			case slices.Contains(q.UnmatchedTargets, t):
				warnings++
				parts = append(parts, t+" by no node (neither this one nor any of the edge's: a typo?)")
			default:
				parts = append(parts, t+" by other nodes only")
			}
		}
		prefix := ""
		if slices.ContainsFunc(parts, func(p string) bool { return strings.HasSuffix(p, "a typo?)") }) {
			prefix = "warning: "
		}
		lines = append(lines, fmt.Sprintf("%salias %s: %s", prefix, q.Model, strings.Join(parts, "; ")))
	}
	for _, a := range provs {
		for _, m := range a.models {
			if len(targeted[m]) == 0 {
				lines = append(lines, fmt.Sprintf("model %s (provider %s): no alias targets it; clients may request it by its name", m, a.id))
			}
		}
	}
	return lines, warnings, nil
}

// edgeQueues reads GET base/admin/v1/queues.
func edgeQueues(ctx context.Context, client *http.Client, base string) ([]adminwire.Queue, error) {
	url := strings.TrimRight(base, "/") + "/admin/v1/queues"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEdgeAdmin, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrEdgeAdmin, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return nil, fmt.Errorf("%w: GET %s: %s: give an admin key (--api-key or $IOP_ADMIN_KEY)", ErrEdgeAdmin, url, resp.Status)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%w: GET %s: %s", ErrEdgeAdmin, url, resp.Status)
	}
	var queues []adminwire.Queue
	if err := json.Unmarshal(body, &queues); err != nil {
		return nil, fmt.Errorf("%w: GET %s: not the queues of an edge: %w", ErrEdgeAdmin, url, err)
	}
	return queues, nil
}
