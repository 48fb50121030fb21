package event_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/event"
)

// With ClaimCheck the payload limit goes up to MaxClaimCheckPayload and a
// payload that is not JSON is no longer bounded by its base64 size in a
// message; without it nothing changes.
func TestLimitsWithClaimCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		lim  event.Limits
		want int
	}{
		{"default", event.Limits{}, event.DefaultPayloadLimit},
		{"default with a claim check", event.Limits{ClaimCheck: true}, event.DefaultPayloadLimit},
		{"over the broker's limit", event.Limits{MaxPayloadBytes: 20 << 20}, event.MaxPayloadLimit},
		{"over the broker's limit with a claim check", event.Limits{MaxPayloadBytes: 20 << 20, ClaimCheck: true}, 20 << 20},
		{"over the claim check's limit", event.Limits{MaxPayloadBytes: 64 << 20, ClaimCheck: true}, event.MaxClaimCheckPayload},
	} {
		if got := tc.lim.PayloadLimit(); got != tc.want {
			t.Errorf("%s: PayloadLimit() = %d, want %d", tc.name, got, tc.want)
		}
	}

	e := event.Event{ID: "e-1", Type: "blob.stored", Source: "blob-service", Topic: "shop.blob.events",
		AggregateID: "b-1", Version: 1, PayloadType: "application/octet-stream", Payload: make([]byte, 12<<20)}
	if err := e.Prepare(time.Now(), event.Limits{MaxPayloadBytes: event.MaxClaimCheckPayload, ClaimCheck: true}); err != nil {
		t.Errorf("a 12 MB binary payload with a claim check: %v", err)
	}
	err := e.Validate(event.Limits{MaxPayloadBytes: event.MaxClaimCheckPayload})
	if !errors.Is(err, event.ErrTooLarge) || !strings.Contains(err.Error(), "payload: at most 9934464 bytes (got 12582912)") {
		t.Errorf("a 12 MB binary payload without a claim check: %v, want too large at 9934464", err)
	}
	e.Payload = make([]byte, event.MaxClaimCheckPayload+1)
	err = e.Validate(event.Limits{MaxPayloadBytes: event.MaxClaimCheckPayload, ClaimCheck: true})
	if !errors.Is(err, event.ErrTooLarge) || !strings.Contains(err.Error(), "at most 33554432 bytes") {
		t.Errorf("over 32 MiB with a claim check: %v, want too large at 33554432", err)
	}
}
