package publish_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
)

// With a claim check the payload limit may go up to 32 MiB, and a 12 MB
// payload is written to the outbox; without one the same payload is 413.
func TestClaimCheckRaisesThePayloadLimit(t *testing.T) {
	pool := pgtest.Schema(t)
	reg := registry.FromTopology(loadTopology(t))
	for name, tc := range map[string]struct {
		o  publish.Options
		ok bool
	}{
		"20 MiB without a claim check": {publish.Options{DB: pool, Registry: reg, MaxPayloadBytes: 20 << 20}, false},
		"20 MiB with a claim check":    {publish.Options{DB: pool, Registry: reg, MaxPayloadBytes: 20 << 20, ClaimCheck: true}, true},
		"32 MiB with a claim check":    {publish.Options{DB: pool, Registry: reg, MaxPayloadBytes: event.MaxClaimCheckPayload, ClaimCheck: true}, true},
		"over 32 MiB":                  {publish.Options{DB: pool, Registry: reg, MaxPayloadBytes: event.MaxClaimCheckPayload + 1, ClaimCheck: true}, false},
	} {
		_, err := publish.New(tc.o)
		if (err == nil) != tc.ok {
			t.Errorf("%s: New: %v, want ok = %v", name, err, tc.ok)
		}
	}

	big := `"` + strings.Repeat("a", 12<<20) + `"`
	send := func(h *harness) (int, []byte) {
		env := envelope(map[string]any{"payload": json.RawMessage(big)})
		status, body, _ := post(t, h.url, mustJSON(t, env), "Content-Type", "application/json")
		return status, body
	}
	with := newHarness(t, func(o *publish.Options) {
		o.ClaimCheck, o.MaxPayloadBytes = true, 16<<20
		o.Budget = time.Minute // a 12 MB write on a busy test machine
	})
	if status, body := send(with); status != http.StatusAccepted {
		t.Errorf("12 MB with a claim check: %d %.300s, want 202", status, body)
	}
	if n := with.rows(t); n != 1 {
		t.Errorf("%d outbox rows, want 1", n)
	}
	without := newHarness(t, func(o *publish.Options) { o.MaxPayloadBytes = event.MaxPayloadLimit })
	if status, body := send(without); status != http.StatusRequestEntityTooLarge || !strings.Contains(string(body), "payload") {
		t.Errorf("12 MB without a claim check: %d %.300s, want 413 naming the payload", status, body)
	}
}
