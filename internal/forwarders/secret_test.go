package forwarders

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// A sealed secret opens under its key for its forwarder only; the value
// stored holds nothing of the secret.
func TestKeysSealAndOpen(t *testing.T) {
	key := NewKey()
	keys, err := ParseKeys(key)
	if err != nil {
		t.Fatal(err)
	}
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	sealed, err := keys.Seal("crm-webhook", secret)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sealed, secret) || strings.Contains(sealed, strings.TrimPrefix(secret, "whsec_")) {
		t.Fatalf("the sealed value %q shows the secret", sealed)
	}
	if again, _ := keys.Seal("crm-webhook", secret); again == sealed {
		t.Fatal("two seals of one secret are equal: the nonce is not random")
	}
	if got, err := keys.Open("crm-webhook", sealed); err != nil || got != secret {
		t.Fatalf("open: %q, %v", got, err)
	}
	// Copied onto another forwarder's row, it does not open.
	if _, err := keys.Open("other-webhook", sealed); err == nil || !strings.Contains(err.Error(), "sealed for another forwarder") {
		t.Fatalf("open as another forwarder: %v", err)
	}
	// Altered, it does not open.
	b := []byte(sealed)
	b[len(b)-3] ^= 1
	if _, err := keys.Open("crm-webhook", string(b)); err == nil {
		t.Fatal("an altered value opened")
	}
	// Another key does not open it, and says which key it needs.
	other, _ := ParseKeys(NewKey())
	if _, err := other.Open("crm-webhook", sealed); err == nil || !strings.Contains(err.Error(), "lacks") {
		t.Fatalf("open under another key: %v", err)
	}
	// A new key put first seals; the old one, kept after it, still opens
	// what it sealed.
	rotated, err := ParseKeys(NewKey() + " " + key)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rotated.Open("crm-webhook", sealed); err != nil || got != secret {
		t.Fatalf("open under the old key kept second: %q, %v", got, err)
	}
	if s2, _ := rotated.Seal("crm-webhook", secret); strings.Split(s2, ":")[1] == strings.Split(sealed, ":")[1] {
		t.Fatal("the new first key does not seal")
	}
	// No key: a clear error.
	var none *Keys
	if _, err := none.Seal("crm-webhook", secret); !errors.Is(err, ErrNoKey) {
		t.Fatalf("seal without a key: %v", err)
	}
}

func TestParseKeys(t *testing.T) {
	if k, err := ParseKeys("  "); k != nil || err != nil {
		t.Fatalf("empty: %v %v, want none", k, err)
	}
	for _, bad := range []string{"not-base64!", "c2hvcnQ=", NewKey() + " x"} {
		if _, err := ParseKeys(bad); err == nil || !strings.Contains(err.Error(), KeyEnv) || !strings.Contains(err.Error(), "32 random bytes") {
			t.Errorf("ParseKeys(%q): %v, want the rule", bad, err)
		}
	}
}

// Secrets gives the current secret, and the previous one until it expires.
func TestSecretsKeepThePreviousOneUntilItExpires(t *testing.T) {
	keys, _ := ParseKeys(NewKey())
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	cur, _ := keys.Seal("crm-webhook", "whsec_new")
	prev, _ := keys.Seal("crm-webhook", "whsec_old")
	f := Forwarder{Name: "crm-webhook", Auth: "hmac", SealedSecret: cur, SealedPrevious: prev, PreviousUntil: now.Add(RotationOverlap)}
	for _, c := range []struct {
		at   time.Time
		want string
	}{
		{now, "whsec_new whsec_old"},
		{now.Add(RotationOverlap - time.Second), "whsec_new whsec_old"},
		{now.Add(RotationOverlap), "whsec_new"},
	} {
		got, err := keys.Secrets(f, c.at)
		if err != nil || strings.Join(got, " ") != c.want {
			t.Errorf("at %s: %v %v, want %s", c.at, got, err, c.want)
		}
	}
	if got, err := keys.Secrets(Forwarder{Name: "x", Auth: "none"}, now); got != nil || err != nil {
		t.Errorf("no hmac: %v %v", got, err)
	}
}
