package access

import (
	"errors"
	"testing"

	"iop/internal/auth"
)

// TestAuthenticate: which key each kind of path needs, and the refusal
// of each wrong one.
func TestAuthenticate(t *testing.T) {
	t.Parallel()
	client, clientHash := auth.Generate()
	admin, adminHash := auth.Generate()
	keys, err := auth.NewKeyring("keys", []auth.Key{{Name: "alice", Hash: clientHash}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	adminKeys, err := auth.NewKeyring("admin_keys", []auth.Key{{Name: "ops", Hash: adminHash}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	internal := keys.Authenticate(client)
	for _, tc := range []struct {
		name       string
		keys       *auth.Keyring
		admin      bool
		secret     string
		internal   *auth.Caller
		wantCaller string // "" for none
		wantErr    error
	}{
		{"admin key on an admin path", keys, true, admin, nil, "", nil},
		{"no key on an admin path", keys, true, "", nil, "", ErrMissingKey},
		{"client key on an admin path", keys, true, client, nil, "", ErrNotAdminKey},
		{"unknown key on an admin path", keys, true, "sk-nope", nil, "", ErrWrongKey},
		{"client key on the API", keys, false, client, nil, "alice", nil},
		{"no key on the API", keys, false, "", nil, "", ErrMissingKey},
		{"admin key on the API", keys, false, admin, nil, "", ErrAdminKeyOnAPI},
		{"unknown key on the API", keys, false, "sk-nope", nil, "", ErrWrongKey},
		{"no client keys: the API is open", nil, false, "", nil, "", nil},
		{"an internal request's caller", keys, false, "", internal, "alice", nil},
	} {
		caller, err := Authenticate(tc.keys, adminKeys, tc.admin, tc.secret, tc.internal)
		if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) {
			t.Fatalf("%s: err %v, want %v", tc.name, err, tc.wantErr)
		}
		got := ""
		if caller != nil {
			got = caller.Name()
		}
		if got != tc.wantCaller {
			t.Fatalf("%s: caller %q, want %q", tc.name, got, tc.wantCaller)
		}
	}
}
