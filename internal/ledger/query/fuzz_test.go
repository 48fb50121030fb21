package query

import (
	"github.com/relaybus/relaybus/internal/ledger/model"
	"testing"
	"time"
)

// Page tokens come back from clients: decoding any string must not panic,
// and a token it accepts must carry the filters' fingerprint and round-trip.
func FuzzPageToken(f *testing.F) {
	fp := (&ListQuery{Status: model.StatusSent, Topic: "shop.order.events"}).fingerprint()
	f.Add(encodeToken(time.Date(2024, 2, 28, 10, 0, 0, 0, time.UTC), "ab12~evt-1", fp))
	f.Add("")
	f.Add("e30")
	f.Add("not base64 !")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := decodeToken(s, fp)
		if err != nil {
			return
		}
		if tok.F != fp || tok.D == "" || tok.V != 1 {
			t.Fatalf("accepted %+v", tok)
		}
		again, err := decodeToken(encodeToken(tok.T, tok.D, tok.F), fp)
		if err != nil || !again.T.Equal(tok.T) || again.D != tok.D {
			t.Fatalf("round trip %+v -> %+v, %v", tok, again, err)
		}
	})
}
