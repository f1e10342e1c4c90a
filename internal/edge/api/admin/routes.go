package admin

import (
	"context"
	"log/slog"
	"maps"
	"net/http"
	"time"

	"iop/internal/edge/api"
	"iop/internal/ledger"
)

// Config says which admin routes are on: each nil field leaves its routes
// out, so the frame answers them 404.
type Config struct {
	// Snapshots serves GET /admin/v1/nodes, /providers, /queues and
	// /cluster (admin.go).
	Snapshots Snapshots
	// Events serves GET /admin/v1/events (events.go) and the dashboard
	// (GET /ui, ui.go).
	Events Events
	// EventsKeepAlive is how often an idle events stream gets a comment
	// line; 0 means DefaultEventsKeepAlive (15s).
	EventsKeepAlive time.Duration
	// Usage serves GET /admin/v1/usage (usage.go).
	Usage Usage
	// TeamOf names the team of a key ("" for none), for the usage
	// route's team= and group_by=team; read at each query. nil: no key
	// is in a team.
	TeamOf func(key string) string
	// History serves GET /admin/v1/history (history.go).
	History History
	// Residency serves POST /admin/v1/providers/{node}/{provider}/load
	// and /unload (residency.go).
	Residency Residency
	// Logger may be nil (then nothing is logged).
	Logger *slog.Logger
}

// Usage is what GET /admin/v1/usage needs of the usage ledger (package
// ledger): its sums. *ledger.Ledger is one.
type Usage interface {
	// Aggregate sums entries; an unknown group_by wraps
	// ledger.ErrInvalidQuery.
	Aggregate(ctx context.Context, q ledger.Query) ([]ledger.Group, error)
}

// server serves the admin routes. Its fields are set by Routes and only
// read after.
type server struct {
	cfg    Config
	logger *slog.Logger
}

// Routes returns the admin routes cfg turns on, by exact path, for
// api.Config.Routes. The frame guards them with the admin keys
// (api.Config.AdminPrefixes covers /admin and /ui).
func Routes(cfg Config) map[string]api.Route {
	if cfg.EventsKeepAlive <= 0 {
		cfg.EventsKeepAlive = DefaultEventsKeepAlive
	}
	s := &server{cfg: cfg, logger: cfg.Logger}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	s.logger = s.logger.With("component", "edge-admin")
	routes := map[string]api.Route{}
	if cfg.Snapshots != nil {
		maps.Copy(routes, stateRoutes(cfg.Snapshots))
	}
	if cfg.Events != nil {
		routes["/admin/v1/events"] = api.Route{Method: http.MethodGet, Serve: s.events}
		maps.Copy(routes, uiRoutes())
	}
	if cfg.Usage != nil {
		routes["/admin/v1/usage"] = api.Route{Method: http.MethodGet, Serve: s.usage}
	}
	if cfg.History != nil {
		routes["/admin/v1/history"] = api.Route{Method: http.MethodGet, Serve: s.history}
	}
	if cfg.Residency != nil {
		maps.Copy(routes, residencyRoutes(cfg.Residency))
	}
	return routes
}
