package api

import (
	"runtime"
	"sync"
	"weak"
)

// scannerReaders are the finalHolds that read the streams given to
// usageScanner.write, one per scanner; an entry goes when its scanner is
// collected.
var scannerReaders sync.Map // weak.Pointer[usageScanner] → *finalHold

// write reads the next bytes of a tunnel answer into u as the tunnel path
// reads them, and returns how many of the events they complete carry
// content: a JSON body is kept by u (observation.tunnelBody); an event
// stream is fed to a finalHold whose one reader tells an observation of
// each event (observation.tunnelEvent), whose usage u then says. The
// finalHold refers to its own scanner, not to u, so that u can be
// collected (and its entry dropped) once the test is done with it.
func (u *usageScanner) write(p []byte) (contentEvents int) {
	if !u.sse {
		u.json(p)
		return 0
	}
	key := weak.Make(u)
	v, ok := scannerReaders.Load(key)
	if !ok {
		v = &finalHold{sse: true, obs: &observation{}}
		scannerReaders.Store(key, v)
		runtime.AddCleanup(u, func(k weak.Pointer[usageScanner]) { scannerReaders.Delete(k) }, key)
	}
	f := v.(*finalHold)
	before := f.obs.req.ContentEvents()
	f.split(p)
	if s := f.obs.usage; s != nil {
		u.found, u.prompt, u.completed = s.found, s.prompt, s.completed
	}
	return f.obs.req.ContentEvents() - before
}
