package admin

import (
	"encoding/base64"
	"encoding/json"
	"sync"
	"testing"

	"iop/internal/edge/adminwire"
	"iop/internal/edge/api"
)

// fakeHistory answers Since with one second at since+1 and records the
// sinces asked.
type fakeHistory struct {
	mu    sync.Mutex // guards asked
	asked []int64
}

func (f *fakeHistory) Since(since int64) adminwire.History {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, since)
	return adminwire.History{Object: "history", Since: since, Through: since + 1,
		Data: []adminwire.Second{{Time: since + 1, Requests: map[string]int{"completed": 2}}}}
}

// TestHistoryRoute: GET /admin/v1/history is an admin route (a Bearer
// admin key, or the admin key as the password of Basic auth with any user
// name, as a browser sends it), passes ?since= on as Unix seconds and
// refuses one that is not an integer.
func TestHistoryRoute(t *testing.T) {
	t.Parallel()
	f := newKeys(t)
	hist := &fakeHistory{}
	env := newEnv(t, api.Config{Keys: f.keys, AdminKeys: f.admin}, Config{History: hist})
	basic := func(user, password string) map[string]string {
		return map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password))}
	}
	for name, c := range map[string]struct {
		header map[string]string
		status int
	}{
		"no key":               {nil, 401},
		"client key":           {bearer(f.alice), 403},
		"wrong password":       {basic("ops", "nope"), 401},
		"admin key":            {bearer(f.adminKey), 200},
		"basic, any user name": {basic("whoever", f.adminKey), 200},
		"basic, no user name":  {basic("", f.adminKey), 200},
	} {
		if resp := env.send(t, "GET", "/admin/v1/history?since=1800000000", c.header); resp.status != c.status {
			t.Errorf("%s: %d %s, want %d", name, resp.status, resp.body, c.status)
		}
	}
	resp := env.send(t, "GET", "/admin/v1/history?since=1800000000", bearer(f.adminKey))
	var got adminwire.History
	if err := json.Unmarshal([]byte(resp.body), &got); err != nil || got.Through != 1800000001 || len(got.Data) != 1 ||
		got.Data[0].Requests["completed"] != 2 || resp.header.Get("Cache-Control") != "no-store" {
		t.Errorf("history: %v %+v (Cache-Control %q)", err, got, resp.header.Get("Cache-Control"))
	}
	if resp := env.send(t, "GET", "/admin/v1/history", bearer(f.adminKey)); resp.status != 200 {
		t.Errorf("no since: %d", resp.status)
	}
	for _, q := range []string{"?since=yesterday", "?since=1.5", "?since=1e9"} {
		if resp := env.send(t, "GET", "/admin/v1/history"+q, bearer(f.adminKey)); resp.status != 400 {
			t.Errorf("%s: %d, want 400", q, resp.status)
		}
	}
	hist.mu.Lock()
	defer hist.mu.Unlock()
	// The four admitted with since, the second read, and the one without.
	want := []int64{1800000000, 1800000000, 1800000000, 1800000000, 0}
	if len(hist.asked) != len(want) || hist.asked[len(hist.asked)-1] != 0 {
		t.Errorf("sinces asked %v, want %v (in any order but the last)", hist.asked, want)
	}
}
