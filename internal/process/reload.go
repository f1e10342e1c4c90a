package process

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"time"

	"github.com/fsnotify/fsnotify"

	"iop/internal/auth"
	"iop/internal/clock"
	"iop/internal/node"
	"iop/internal/quota"
)

// reloadSettle is how long the config file must stay unchanged after an
// event before it is read: an editor's save is several events (truncate,
// write, rename), and a file written in parts is partial until the last.
// SIGHUP reads the file at once, and a change still settling is read with
// it (no second reload when the settling would have ended).
const reloadSettle = time.Second

// watchConfig calls reload at each value from hup (SIGHUP; nil: never),
// with the trigger "SIGHUP", and, when path is set, whenever the file at
// path changes, with "file changed" (it watches the file's directory, so a
// file replaced by rename, as editors and Kubernetes ConfigMaps do, is seen
// too), until stop is called. A nil reload logs, at each SIGHUP, that there
// is no config file to read again. It returns once the watch is set up;
// stop ends it and returns once it has ended.
func watchConfig(path string, reload func(trigger string), logger *slog.Logger, hup <-chan os.Signal) (stop func(), err error) {
	w := configWatch{clock: clock.Real(), hup: hup, reload: reload, logger: logger, path: path}
	var watcher *fsnotify.Watcher
	if path != "" && reload != nil {
		if watcher, err = fsnotify.NewWatcher(); err != nil {
			return nil, fmt.Errorf("watching %s: %w", path, err)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			watcher.Close()
			return nil, err
		}
		if err := watcher.Add(filepath.Dir(abs)); err != nil {
			watcher.Close()
			return nil, fmt.Errorf("watching %s: %w", path, err)
		}
		w.events, w.errs, w.name = watcher.Events, watcher.Errors, filepath.Base(abs)
	}
	if reload == nil {
		w.reload = func(trigger string) {
			logger.Info("nothing to reload: started without --config; the process keeps running", "component", "config", "trigger", trigger)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if watcher != nil {
			defer watcher.Close()
		}
		w.run(ctx)
	}()
	return func() { cancel(); <-done }, nil
}

// configWatch is watchConfig's loop: the signals and file events it
// reads, and the settle timer between a file event and the reload.
type configWatch struct {
	clock  clock.Clock
	hup    <-chan os.Signal
	events <-chan fsnotify.Event // nil: no file watched
	errs   <-chan error
	name   string // the watched file's base name
	path   string // as configured, for logs
	reload func(trigger string)
	logger *slog.Logger
}

// run reads until ctx ends or the watcher's channels close. The settle
// timer's callback sends its generation on fired; a generation that is not
// the latest (a timer stopped or replaced after it fired) is ignored.
func (w *configWatch) run(ctx context.Context) {
	fired := make(chan uint64, 1)
	var settle clock.Timer
	var gen uint64
	stopSettle := func() {
		if settle != nil {
			settle.Stop()
			settle = nil
		}
		gen++
	}
	defer stopSettle()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.hup:
			stopSettle()
			w.reload("SIGHUP")
		case ev, ok := <-w.events:
			if !ok {
				return
			}
			// "..data" is the symlink a Kubernetes ConfigMap swaps.
			if name := filepath.Base(ev.Name); name == w.name || name == "..data" {
				stopSettle()
				g := gen
				settle = w.clock.AfterFunc(reloadSettle, func() {
					select {
					case fired <- g:
					case <-ctx.Done():
					}
				})
			}
		case g := <-fired:
			if g == gen && settle != nil {
				settle = nil
				w.reload("file changed")
			}
		case err, ok := <-w.errs:
			if !ok {
				return
			}
			w.logger.Warn("watching the config file failed", "component", "config", "path", w.path, "err", err)
		}
	}
}

// edgeReloader applies a configuration read again to a running edge: the
// edge's own part (edge.Service.Reload) and the HTTP API's keyrings.
type edgeReloader struct {
	e      *edgeProcess
	logger *slog.Logger
}

// namedChange names the entries (keys of one keyring, teams, priced
// models) a reload added, removed and changed, each list sorted.
type namedChange struct{ added, removed, changed []string }

// diffNamed compares old and next by the name each entry has.
func diffNamed[T any](old, next []T, name func(T) string) namedChange {
	byName := make(map[string]T, len(old))
	for _, x := range old {
		byName[name(x)] = x
	}
	var c namedChange
	for _, x := range next {
		was, ok := byName[name(x)]
		switch {
		case !ok:
			c.added = append(c.added, name(x))
		case !reflect.DeepEqual(was, x):
			c.changed = append(c.changed, name(x))
		}
		delete(byName, name(x))
	}
	for n := range byName {
		c.removed = append(c.removed, n)
	}
	slices.Sort(c.added)
	slices.Sort(c.removed)
	slices.Sort(c.changed)
	return c
}

func diffKeys(old, next []auth.Key) namedChange {
	return diffNamed(old, next, func(k auth.Key) string { return k.Name })
}

func diffTeams(old, next []auth.Team) namedChange {
	return diffNamed(old, next, func(t auth.Team) string { return t.Name })
}

// diffPrices compares two price tables by model name.
func diffPrices(old, next map[string]quota.Price) namedChange {
	type priced struct {
		model string
		price quota.Price
	}
	list := func(m map[string]quota.Price) []priced {
		out := make([]priced, 0, len(m))
		for model, p := range m {
			out = append(out, priced{model, p})
		}
		return out
	}
	return diffNamed(list(old), list(next), func(p priced) string { return p.model })
}

// apply validates every part of file (EdgeFile.Validate), reads its keys
// file and checks that no keyring is emptied (checkKeysKept) first, then
// applies the edge core's part (edge.Service.Reload) and swaps the
// keyrings; a cfg refused anywhere changes nothing. It logs
// what changed and what needs a restart.
func (r *edgeReloader) apply(file EdgeFile, trigger string) error {
	if err := file.Validate(); err != nil {
		return err
	}
	cfg, err := file.AccessConfig.LoadKeysFile()
	if err != nil {
		return err
	}
	if err := checkKeysKept(r.e.Keys.Len(), r.e.AdminKeys.Len(), cfg); err != nil {
		return err
	}
	r.e.keysMu.Lock()
	defer r.e.keysMu.Unlock()
	res, err := r.e.Service.Reload(file.Config)
	if err != nil {
		return err
	}
	keys, admin := diffKeys(r.e.keyCfg, cfg.Keys), diffKeys(r.e.adminCfg, cfg.AdminKeys)
	teams, prices := diffTeams(r.e.teamCfg, cfg.Teams), diffPrices(r.e.priceCfg, cfg.Prices)
	// Validated above: Replace cannot fail now.
	if err := r.e.Keys.Replace(cfg.Keys); err != nil {
		return err
	}
	if err := r.e.AdminKeys.Replace(cfg.AdminKeys); err != nil {
		return err
	}
	r.e.keyCfg, r.e.adminCfg, r.e.teamCfg, r.e.priceCfg = cfg.Keys, cfg.AdminKeys, cfg.Teams, cfg.Prices
	configureQuota(r.e.Quota, cfg)
	log := r.logger.With("component", "config")
	log.Info("config reloaded", "trigger", trigger, "added", res.Added, "removed", res.Removed,
		"changed", res.Changed, "queue_changed", res.QueueChanged,
		"keys_added", keys.added, "keys_removed", keys.removed, "keys_changed", keys.changed,
		"admin_keys_added", admin.added, "admin_keys_removed", admin.removed, "admin_keys_changed", admin.changed,
		"teams_added", teams.added, "teams_removed", teams.removed, "teams_changed", teams.changed,
		"prices_added", prices.added, "prices_removed", prices.removed, "prices_changed", prices.changed,
		"tokens_added", res.TokensAdded, "tokens_removed", res.TokensRemoved)
	file.SetDefaults()
	restart := append(append(res.Restart, r.e.cfg.restartOnly(file)...), r.e.localRestart(file)...)
	slices.Sort(restart)
	if len(restart) > 0 {
		log.Warn("config settings changed that apply only after a restart; they keep their running values", "settings", restart)
	}
	return nil
}

// localRestart names the keys of file about the edge's own providers
// (providers, local_node_id) that differ from what runs: they apply only
// at the next start.
func (e *edgeProcess) localRestart(file EdgeFile) []string {
	var providers []node.ProviderConfig
	id := DefaultLocalNodeID
	if e.local != nil {
		providers, id = e.local.cfg.Providers, e.local.cfg.NodeID
	}
	var out []string
	if !reflect.DeepEqual(providers, file.Providers) && (len(providers) > 0 || len(file.Providers) > 0) {
		out = append(out, "providers")
	}
	if next := cmp.Or(file.LocalNodeID, DefaultLocalNodeID); next != id {
		out = append(out, "local_node_id")
	}
	return out
}

// checkKeysKept refuses, with ErrKeysEmptied, a cfg that has no client
// keys while running has some (running: the running client keyring's
// length), or no admin keys while runningAdmin > 0, unless cfg sets
// insecure_open: a file read while half written must not open the API.
func checkKeysKept(running, runningAdmin int, cfg AccessConfig) error {
	if cfg.InsecureOpen {
		return nil
	}
	if len(cfg.Keys) == 0 && running > 0 {
		return fmt.Errorf("%w: the new config has no keys, the running one has %d (set insecure_open: true to mean it)", ErrKeysEmptied, running)
	}
	if len(cfg.AdminKeys) == 0 && runningAdmin > 0 {
		return fmt.Errorf("%w: the new config has no admin_keys, the running one has %d (set insecure_open: true to mean it)", ErrKeysEmptied, runningAdmin)
	}
	return nil
}

// nodeReloader applies a configuration read again to a running node.
func reloadNode(agent *node.Agent, cfg node.Config, trigger string, logger *slog.Logger) error {
	res, err := agent.Reload(cfg)
	if err != nil {
		return err
	}
	log := logger.With("component", "config")
	log.Info("config reloaded", "trigger", trigger, "applied", res.Applied)
	if len(res.Restart) > 0 {
		log.Warn("config settings changed that apply only after a restart; they keep their running values", "settings", res.Restart)
	}
	return nil
}

// reloadFunc makes the reload callback of watchConfig from load (the file
// read again under the flags) and apply; nil when load is nil. A
// configuration that cannot be read or is refused is logged, and the
// running one stays.
func reloadFunc[C any](load func() (C, error), apply func(C, string) error, logger *slog.Logger) func(string) {
	if load == nil {
		return nil
	}
	return func(trigger string) {
		cfg, err := load()
		if err == nil {
			if err = apply(cfg, trigger); err == nil {
				return
			}
		}
		logger.Error("config reload refused; the running config stays", "component", "config", "trigger", trigger, "err", err)
	}
}
