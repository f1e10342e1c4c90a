package api

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
)

// reasoningSeal makes and opens the encrypted_content of Responses
// reasoning items: the reasoning text sealed with AES-256-GCM under a key
// this edge made at start (so a token lives as long as the edge process,
// and another edge cannot open it), as base64url(nonce || sealed). Safe
// for concurrent use: the AEAD is immutable.
type reasoningSeal struct {
	aead cipher.AEAD
}

// reasoningAAD binds a token to its use.
var reasoningAAD = []byte("iop responses reasoning v1")

// errForeignReasoning: a token this edge did not make, or one altered.
var errForeignReasoning = errors.New("encrypted_content was not made by this gateway, or was altered (tokens do not survive an edge restart)")

// newReasoningSeal is a seal with a new random key.
func newReasoningSeal() *reasoningSeal {
	key := make([]byte, 32)
	rand.Read(key)
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
