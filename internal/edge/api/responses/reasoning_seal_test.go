package responses

import (
	"errors"
	"testing"
)

// TestReasoningSealSharedSecret: edges given the same secret open each
// other's encrypted_content (several edges behind one load balancer, or
// one edge after a restart); another secret, no secret, or an altered
// token is errForeignReasoning.
func TestReasoningSealSharedSecret(t *testing.T) {
	t.Parallel()
	const text = "first add 2 and 2"
	a, b := newReasoningSeal([]byte("cluster-token")), newReasoningSeal([]byte("cluster-token"))
	token := a.seal(text)
	if got, err := b.open(token); err != nil || got != text {
		t.Fatalf("another edge with the same secret: %q, %v", got, err)
	}
	if a.seal(text) == token {
		t.Error("two seals of one text are equal: the nonce is not fresh")
	}
	for name, s := range map[string]*reasoningSeal{
		"another secret": newReasoningSeal([]byte("other-token")),
		"no secret":      newReasoningSeal(nil),
	} {
		if _, err := s.open(token); !errors.Is(err, errForeignReasoning) {
			t.Errorf("%s: open = %v, want errForeignReasoning", name, err)
		}
	}
	altered := []byte(token)
	altered[len(altered)/2] ^= 1
	for _, bad := range []string{string(altered), "", "!!", token[:8]} {
		if _, err := b.open(bad); !errors.Is(err, errForeignReasoning) {
			t.Errorf("open(%q) = %v, want errForeignReasoning", bad, err)
		}
	}
	r1, r2 := newReasoningSeal(nil), newReasoningSeal(nil)
	if _, err := r2.open(r1.seal(text)); !errors.Is(err, errForeignReasoning) {
		t.Errorf("two edges without a secret: open = %v, want errForeignReasoning", err)
	}
}
