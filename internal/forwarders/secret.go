package forwarders

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
)

// KeyEnv names the environment variable that holds the key the signing
// secrets of hmac forwarders are sealed under. The operators' API (which
// generates and seals a secret) and the forwarders consume service (which
// opens it to sign) both read it; in deployment it comes from Secret
// Manager.
const KeyEnv = "RELAYBUS_FORWARDERS_KEY"

// RotationOverlap is how long a rotated-out signing secret still signs,
// beside the new one: a target verifying with either accepts the
// requests while its owner switches (each request then carries two v1
// signatures, as Standard Webhooks allows).
const RotationOverlap = 24 * time.Hour

// sealVersion starts every sealed value: "v1:<key id>:<base64 of nonce
// || AES-256-GCM ciphertext>".
const sealVersion = "v1"

// Keys seal and open the signing secrets stored in the registry: AES-256-GCM
// with a random nonce, the forwarder's name as additional data (a value
// copied onto another forwarder's row does not open). The first key seals;
// every key opens the values sealed under it, found by its id (the first 8
// hex digits of the key's SHA-256), so a new key can be put first while
// the old one still opens the rows it sealed.
type Keys struct {
	seal string
	aead map[string]cipher.AEAD
}

// ErrNoKey: a signing secret must be sealed or opened and no key is set.
var ErrNoKey = errors.New("forwarders: " + KeyEnv + " is not set: hmac forwarders' signing secrets are sealed under it")

// ParseKeys reads KeyEnv's value: one or more keys, space-separated, each
// the standard base64 of 32 random bytes (`openssl rand -base64 32`).
// Empty: nil keys (hmac forwarders cannot be added nor served).
func ParseKeys(s string) (*Keys, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return nil, nil
	}
	k := &Keys{aead: map[string]cipher.AEAD{}}
	for i, f := range fields {
		raw, err := base64.StdEncoding.DecodeString(f)
		if err != nil || len(raw) != 32 {
			return nil, fmt.Errorf("forwarders: %s: key %d must be the standard base64 of 32 random bytes (openssl rand -base64 32)", KeyEnv, i+1)
		}
		block, err := aes.NewCipher(raw)
		if err != nil {
			return nil, fmt.Errorf("forwarders: %s: key %d: %w", KeyEnv, i+1, err)
		}
		gcm, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("forwarders: %s: key %d: %w", KeyEnv, i+1, err)
		}
		sum := sha256.Sum256(raw)
		id := fmt.Sprintf("%x", sum[:4])
		if i == 0 {
			k.seal = id
		}
		k.aead[id] = gcm
	}
	return k, nil
}

// NewKey returns a fresh key in KeyEnv's format (the local stack makes one
// when none is set).
func NewKey() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return base64.StdEncoding.EncodeToString(b[:])
}

// Seal seals a signing secret for the forwarder named name.
func (k *Keys) Seal(name, secret string) (string, error) {
	if k == nil {
		return "", ErrNoKey
	}
	gcm := k.aead[k.seal]
	nonce := make([]byte, gcm.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("forwarders: seal: %w", err)
	}
	out := gcm.Seal(nonce, nonce, []byte(secret), []byte(name))
	return sealVersion + ":" + k.seal + ":" + base64.StdEncoding.EncodeToString(out), nil
}

// Open opens a value Seal made for the forwarder named name.
func (k *Keys) Open(name, sealed string) (string, error) {
	if k == nil {
		return "", ErrNoKey
	}
	parts := strings.SplitN(sealed, ":", 3)
	if len(parts) != 3 || parts[0] != sealVersion {
		return "", errors.New("forwarders: the stored signing secret is not a sealed value")
	}
	gcm, ok := k.aead[parts[1]]
	if !ok {
		return "", fmt.Errorf("forwarders: the signing secret of %s is sealed under key %s, which %s lacks (put the new key first, keep the old ones after it)", name, parts[1], KeyEnv)
	}
	raw, err := base64.StdEncoding.DecodeString(parts[2])
	if err != nil || len(raw) < gcm.NonceSize() {
		return "", errors.New("forwarders: the stored signing secret is not a sealed value")
	}
	plain, err := gcm.Open(nil, raw[:gcm.NonceSize()], raw[gcm.NonceSize():], []byte(name))
	if err != nil {
		return "", fmt.Errorf("forwarders: the signing secret of %s does not open under key %s (altered, or sealed for another forwarder)", name, parts[1])
	}
	return string(plain), nil
}

// Secrets opens f's signing secrets as they sign at now: the current one,
// then the rotated-out one while it is within RotationOverlap (its
// PreviousUntil). None when f's auth is not hmac.
func (k *Keys) Secrets(f Forwarder, now time.Time) ([]string, error) {
	if f.SealedSecret == "" {
		return nil, nil
	}
	cur, err := k.Open(f.Name, f.SealedSecret)
	if err != nil {
		return nil, err
	}
	out := []string{cur}
	if f.SealedPrevious != "" && now.Before(f.PreviousUntil) {
		prev, err := k.Open(f.Name, f.SealedPrevious)
		if err != nil {
			return nil, err
		}
		out = append(out, prev)
	}
	return out, nil
}
