package apitest

import (
	"testing"

	"iop/internal/auth"
)

// Keys is a client keyring of two keys, alice and bob, and an admin
// keyring of one, with their secrets.
type Keys struct {
	Keys, Admin          *auth.Keyring
	Alice, Bob, AdminKey string // the secrets
}

// NewKeys makes keys alice (with alice's limits and models) and bob, and
// the admin key ops.
func NewKeys(t testing.TB, alice auth.Key) Keys {
	t.Helper()
	var k Keys
	var h string
	k.Alice, h = auth.Generate()
	alice.Name, alice.Hash = "alice", h
	k.Bob, h = auth.Generate()
	bob := auth.Key{Name: "bob", Hash: h}
	k.AdminKey, h = auth.Generate()
	adm := auth.Key{Name: "ops", Hash: h}
	var err error
	if k.Keys, err = auth.NewKeyring("keys", []auth.Key{alice, bob}, nil); err != nil {
		t.Fatal(err)
	}
	if k.Admin, err = auth.NewKeyring("admin_keys", []auth.Key{adm}, nil); err != nil {
		t.Fatal(err)
	}
	return k
}
