package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"iop/internal/edge/api"
	"iop/internal/quota"
)

// TestQuotasReadAndChange: GET /admin/v1/quotas lists every key and team
// with its windows; ?key= and ?team= read one; PUT changes a quota's
// limits at once; unknown names are 404, bad limits 400.
func TestQuotasReadAndChange(t *testing.T) {
	t.Parallel()
	l := quota.New(quota.Config{})
	l.Configure(map[string]quota.Scope{"a": {Team: "t", Bounds: quota.Limits{TokensPerMinute: 100}.Bounds()}, "b": {}},
		map[string]quota.Scope{"t": {Bounds: quota.Limits{GPUSecondsPerDay: 1.5}.Bounds()}}, nil)
	if _, err := l.Reserve("a", quota.Usage{InputTokens: 30}); err != nil {
		t.Fatal(err)
	}
	env := newEnv(t, api.Config{}, Config{Quotas: l})

	resp := env.get(t, "/admin/v1/quotas")
	var list struct {
		Data []quotaJSON `json:"data"`
	}
	if err := json.Unmarshal([]byte(resp.body), &list); err != nil || resp.status != 200 || len(list.Data) != 3 {
		t.Fatalf("%d %s (%v)", resp.status, resp.body, err)
	}
	if a := list.Data[0]; a.Name != "a" || a.Team != "t" || a.Quota.TokensPerMinute != 100 || len(a.Windows) != 1 ||
		a.Windows[0].Used != 30 || a.Windows[0].Remaining != 70 || a.Windows[0].Unit != "tokens" {
		t.Errorf("key a: %+v", a)
	}
	if team := list.Data[2]; team.Scope != "team" || team.Quota.GPUSecondsPerDay != 1.5 || team.Windows[0].Limit != 1500 {
		t.Errorf("team t: %+v", team)
	}

	put := func(query, body string) rawResponse {
		req, _ := http.NewRequest("PUT", env.srv.URL+"/admin/v1/quotas?"+query, strings.NewReader(body))
		res, err := env.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return rawResponse{res.StatusCode, res.Header, string(b)}
	}
	if resp := put("key=a", `{"tokens_per_minute":20}`); resp.status != 200 || !strings.Contains(resp.body, `"limit":20`) {
		t.Fatalf("PUT: %d %s", resp.status, resp.body)
	}
	if _, err := l.Reserve("a", quota.Usage{InputTokens: 1}); err == nil {
		t.Error("a reservation over the changed limit was taken")
	}
	if resp := put("team=t", `{"requests_per_day":5}`); resp.status != 200 || !strings.Contains(resp.body, `"requests_per_day":5`) {
		t.Fatalf("PUT team: %d %s", resp.status, resp.body)
	}
	for _, c := range []struct {
		query, body string
		status      int
		says        string
	}{
		{"key=nobody", `{}`, 404, "nobody"},
		{"key=a", `{"tokens_per_minute":-1}`, 400, "tokens_per_minute"},
		// Regression: a key's admission settings were refused with a team's message.
		{"key=a", `{"uncapped":"refuse"}`, 400, "keys file"},
		{"team=t", `{"uncapped":"refuse"}`, 400, "not a team's"},
		{"key=a", `{"tokens_per_mnute":5}`, 400, "tokens_per_mnute"},
		{"", `{}`, 400, "key"},
		// Regression: null decoded as no field and removed every limit;
		// ?key=&team= chose the team without a word.
		{"key=a", `null`, 400, "quota object"},
		{"key=a", ` [] `, 400, "quota object"},
		{"key=a&team=t", `{}`, 400, "not both"},
		// Regression: a second object after the first was dropped silently.
		{"key=a", `{"tokens_per_minute":5}{"tokens_per_day":1}`, 400, "nothing after it"},
	} {
		if resp := put(c.query, c.body); resp.status != c.status || !strings.Contains(resp.body, c.says) {
			t.Errorf("PUT ?%s %s: %d %s, want %d saying %q", c.query, c.body, resp.status, resp.body, c.status, c.says)
		}
	}
	if st, _ := l.Describe(quota.ScopeKey, "a"); st.Limits.TokensPerMinute != 20 {
		t.Errorf("the refused changes changed key a: %+v", st.Limits)
	}
	if resp := env.get(t, "/admin/v1/quotas?team=nope"); resp.status != 404 {
		t.Errorf("unknown team: %d", resp.status)
	}
	if resp := env.send(t, "DELETE", "/admin/v1/quotas?key=a", nil); resp.status != 405 {
		t.Errorf("DELETE: %d", resp.status)
	}
}
