package process

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"iop/internal/edge"
)

// reloadSettle is how long the config file must stay unchanged after an
// event before it is read: an editor's save is several events (truncate,
// write, rename), and reading between them would see a partial file.
const reloadSettle = 100 * time.Millisecond

// watchEdgeConfig reloads the edge's configuration at each value from hup
// (SIGHUP, for iop edge; nil: never) and whenever
// the file at path changes (it watches the file's directory, so a file
// replaced by rename, as editors and Kubernetes ConfigMaps do, is seen too),
// until ctx ends. load reads the new configuration (the file under the
// command's flags); svc.Reload applies it. A configuration that cannot be
// read or is invalid is refused with an error log line naming the problem,
// and the running one stays. It returns once the watch is set up, and a
// channel closed when it has stopped.
func watchEdgeConfig(ctx context.Context, path string, load func() (edge.Config, error), svc *edge.Service, logger *slog.Logger, hup <-chan os.Signal) (<-chan struct{}, error) {
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
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
	log := logger.With("component", "config", "path", path)
	reload := func(trigger string) {
		cfg, err := load()
		if err == nil {
			var res edge.ReloadResult
			if res, err = svc.Reload(cfg); err == nil {
				log.Info("config reloaded", "trigger", trigger, "added", res.Added, "removed", res.Removed,
					"changed", res.Changed, "queue_changed", res.QueueChanged)
				if len(res.Restart) > 0 {
					log.Warn("config settings changed that apply only after a restart; they keep their running values", "settings", res.Restart)
				}
				return
			}
		}
		log.Error("config reload refused; the running config stays", "trigger", trigger, "err", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer watcher.Close()
		settle := time.NewTimer(reloadSettle)
		settle.Stop()
		defer settle.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				reload("SIGHUP")
			case ev, ok := <-watcher.Events:
				if !ok {
					return
				}
				// "..data" is the symlink a Kubernetes ConfigMap swaps.
				if name := filepath.Base(ev.Name); name == filepath.Base(abs) || name == "..data" {
					settle.Reset(reloadSettle)
				}
			case <-settle.C:
				reload("file changed")
			case err, ok := <-watcher.Errors:
				if !ok {
					return
				}
				log.Warn("watching the config file failed", "err", err)
			}
		}
	}()
	return done, nil
}
