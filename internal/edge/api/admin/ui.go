package admin

import (
	"embed"
	"io/fs"
	"mime"
	"net/http"
	"path"

	"iop/internal/edge/api"
)

// uiFiles are the dashboard's static files, embedded in the binary: no CDN,
// no file on disk.
//
//go:embed ui
var uiFiles embed.FS

// uiRoutes serves the live dashboard: GET /ui (and /ui/) is its page, each
// other file of ui/ is GET /ui/<name>. The page reads the admin routes and
// follows GET /admin/v1/events, so it shows data only when Config.Snapshots
// and Config.Events are set; its charts (charts.js) read GET
// /admin/v1/history (Config.History) each second. It builds every URL
// from its origin, never relative to its own URL, which may hold
// credentials (http://user:KEY@edge/ui) that fetch refuses.
func uiRoutes() map[string]api.Route {
	routes := make(map[string]api.Route)
	_ = fs.WalkDir(uiFiles, "ui", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := uiFiles.ReadFile(name)
		if err != nil {
			return err
		}
		serve := func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			h.Set("Content-Type", mime.TypeByExtension(path.Ext(name)))
			h.Set("Cache-Control", "no-cache")
			h.Set("X-Content-Type-Options", "nosniff")
			h.Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'")
			w.WriteHeader(http.StatusOK)
			if r.Method != http.MethodHead {
				_, _ = w.Write(data)
			}
		}
		routes["/"+name] = api.Route{Method: http.MethodGet, Serve: serve}
		if path.Base(name) == "index.html" {
			routes["/ui"] = api.Route{Method: http.MethodGet, Serve: serve}
			routes["/ui/"] = api.Route{Method: http.MethodGet, Serve: serve}
		}
		return nil
	})
	return routes
}
