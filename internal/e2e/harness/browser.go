package harness

import (
	"context"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"iop/internal/testenv"
)

// browser is the headless Chromium (Debian's chromium package, which
// `make test` installs when it is missing) that the test binary's browser
// tests share: the first Tab starts it, Main stops it after the last test.
// Sharing it saves each test the browser's own processes (~1 CPU-second);
// the tab, its renderer and the page cost the rest (~3).
var browser struct {
	once sync.Once
	ctx  context.Context // the browser's first tab; every Tab is its child
	stop func()
	err  error
}

// Tab opens a tab of its own for t in the shared browser, its viewport
// width × height CSS pixels, and returns its context: every chromedp
// action on it fails once timeout has passed. The tab is closed when t
// ends. A missing Chromium fails t under IOP_TEST_STRICT, else skips it.
func Tab(t testing.TB, width, height int64, timeout time.Duration) context.Context {
	t.Helper()
	path := chromiumPath(t)
	browser.once.Do(func() {
		opts := append(chromedp.DefaultExecAllocatorOptions[:],
			chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.Flag("disable-dev-shm-usage", true))
		allocCtx, stopAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, stopBrowser := chromedp.NewContext(allocCtx)
		browser.ctx, browser.stop = ctx, func() { stopBrowser(); stopAlloc() }
		// Start it now, so a tab's timeout does not count the launch.
		browser.err = chromedp.Do(ctx)
	})
	if browser.err != nil {
		t.Fatalf("starting %s: %v", path, browser.err)
	}
	tab, closeTab := chromedp.NewContext(browser.ctx)
	t.Cleanup(closeTab)
	page, stop := context.WithTimeout(tab, timeout)
	t.Cleanup(stop)
	if err := chromedp.Do(page, chromedp.EmulateViewport(width, height)); err != nil {
		t.Fatalf("opening a tab: %v", err)
	}
	return page
}

// stopBrowser ends the shared browser, if a test started it, and waits
// for its process to exit.
func stopBrowser() {
	if browser.stop != nil {
		browser.stop()
	}
}

// chromiumPath finds the browser, failing or skipping t (testenv.Missing)
// when there is none.
func chromiumPath(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Missing(t, "chromium is not installed: run `make test`, which installs Debian's chromium package (or apt-get install chromium)")
	return ""
}
