package forwarders_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The registry in Postgres: a forwarder's sealed secrets round-trip and
// its row holds them only sealed; a change made from an older revision is
// refused (ErrChanged), so a rotation's secret is never answered to one
// caller and overwritten by another's.
func TestStoreKeepsSealedSecretsAndRefusesAStaleChange(t *testing.T) {
	ctx := context.Background()
	db := pgtest.Schema(t)
	if _, err := inbox.Migrations.Apply(ctx, db); err != nil {
		t.Fatal(err)
	}
	keys, err := forwarders.ParseKeys(forwarders.NewKey())
	if err != nil {
		t.Fatal(err)
	}
	const secret = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA=="
	sealed, err := keys.Seal("erp-webhook", secret)
	if err != nil {
		t.Fatal(err)
	}
	f, err := forwarders.Add(ctx, db, forwarders.Forwarder{Name: "erp-webhook", Topic: "shop.order.events", URL: "https://erp.example.com/hooks",
		Auth: "hmac", SealedSecret: sealed}, "ops@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if f.SealedSecret != sealed || f.SealedPrevious != "" || !f.PreviousUntil.IsZero() {
		t.Fatalf("added: %+v", f)
	}
	var row string
	if err := db.QueryRow(ctx, `SELECT t::text FROM relaybus_inbox_forwarders t`).Scan(&row); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(row, strings.TrimPrefix(secret, "whsec_")) {
		t.Fatalf("the row holds the secret: %s", row)
	}

	// A rotation: the previous secret kept with its end.
	next, _ := keys.Seal("erp-webhook", "whsec_bmV4dC1uZXh0LW5leHQtbmV4dC1uZXh0LW5leHQ=")
	until := time.Now().Add(forwarders.RotationOverlap).UTC().Truncate(time.Second)
	rotated := f
	rotated.SealedPrevious, rotated.PreviousUntil, rotated.SealedSecret = f.SealedSecret, until, next
	got, changed, err := forwarders.Update(ctx, db, rotated, "ops@example.com")
	if err != nil || !changed || got.Revision != 2 || got.SealedSecret != next || got.SealedPrevious != sealed || !got.PreviousUntil.Equal(until) {
		t.Fatalf("rotate: %+v %v %v", got, changed, err)
	}
	if secrets, err := keys.Secrets(got, time.Now()); err != nil || len(secrets) != 2 || secrets[1] != secret {
		t.Fatalf("the stored secrets open to %v, %v", secrets, err)
	}

	// Another change read at revision 1 comes second: refused, nothing
	// written.
	stale := f
	stale.SealedSecret, _ = keys.Seal("erp-webhook", "whsec_c3RhbGUtc3RhbGUtc3RhbGUtc3RhbGUtc3RhbGU=")
	if _, _, err := forwarders.Update(ctx, db, stale, "other@example.com"); !errors.Is(err, forwarders.ErrChanged) {
		t.Fatalf("a change from revision 1 after revision 2: %v, want ErrChanged", err)
	}
	if cur, err := forwarders.Get(ctx, db, "erp-webhook"); err != nil || cur.SealedSecret != next || cur.Revision != 2 {
		t.Fatalf("after the refused change: %+v %v", cur, err)
	}
	// The same settings again: nothing changed, no error.
	if _, changed, err := forwarders.Update(ctx, db, got, "ops@example.com"); err != nil || changed {
		t.Fatalf("an identical write: changed %v, %v", changed, err)
	}
}
