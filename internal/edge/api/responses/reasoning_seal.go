package responses

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
)

// reasoningSeal makes and opens the encrypted_content of Responses
// reasoning items: the reasoning text sealed with AES-256-GCM, as
// base64url(nonce || sealed), under a key derived from the edge's
// Config.ReasoningSecret (so every edge of a deployment opens the others'
// tokens) or, without one, made at start (a token then lives as long as
// the edge process, and another edge cannot open it). Safe for concurrent
// use: the AEAD is immutable.
type reasoningSeal struct {
	aead cipher.AEAD
}

// reasoningAAD binds a token to its use; it is also the HKDF info.
var reasoningAAD = []byte("iop responses reasoning v1")

// errForeignReasoning: a token this edge did not make, or one altered.
var errForeignReasoning = errors.New("encrypted_content was not made by this gateway, or was altered (without a shared secret, tokens do not survive an edge restart)")

// newReasoningSeal is a seal with the key HKDF-SHA256 derives from secret
// (RFC 5869), or a random key when secret is empty.
func newReasoningSeal(secret []byte) *reasoningSeal {
	key := make([]byte, 32)
	if len(secret) == 0 {
		rand.Read(key)
	} else {
		var err error
		if key, err = hkdf.Key(sha256.New, secret, nil, string(reasoningAAD), 32); err != nil {
			panic(err) // 32 bytes of SHA-256 output are always available
		}
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return &reasoningSeal{aead: aead}
}

// seal is the token of reasoning.
func (s *reasoningSeal) seal(reasoning string) string {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(reasoning)+s.aead.Overhead())
	rand.Read(nonce)
	return base64.RawURLEncoding.EncodeToString(s.aead.Seal(nonce, nonce, []byte(reasoning), reasoningAAD))
}

// open is the reasoning of token, or errForeignReasoning.
func (s *reasoningSeal) open(token string) (string, error) {
	data, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(data) < s.aead.NonceSize() {
		return "", errForeignReasoning
	}
	n := s.aead.NonceSize()
	plain, err := s.aead.Open(nil, data[:n], data[n:], reasoningAAD)
	if err != nil {
		return "", errForeignReasoning
	}
	return string(plain), nil
}
