package dlqreplay_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/privacy"
	"github.com/relaybus/relaybus/internal/privacy/topologyrules"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// A topic whose privacy rule redacts its archive: the dead letter comes in
// through the archive's endpoint and is shown with the email hashed and
// redactedFields; replaying it, alone, by filter or in a replay job, is
// refused (409 payload_redacted) rather than delivering the hashed payload
// as if it were the event. The console says which field was redacted.
func TestRedactedDeadLetterIsNotReplayed(t *testing.T) {
	key, _ := privacy.NewKey("archive-redact-key-0123456789")
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		for i := range o.Topology.Topics {
			if o.Topology.Topics[i].Name == "shop.order.events" {
				o.Topology.Topics[i].Privacy = topology.Privacy{Fields: []string{"/email"}, Archive: "redact"}
			}
		}
		o.Archive = archive.New(o.Ledger.Client(), archive.WithPrivacy(topologyrules.Of(o.Topology), key))
		o.Auth = dlqreplay.AuthNone
	})
	ev := &event.Event{ID: "evt-r1", Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
		AggregateID: "order-r", Version: 1, OccurredAt: time.Now().UTC(), Payload: []byte(`{"email":"carol@example.com","total":5}`)}
	ev.Normalize()
	m, err := cloudevent.Encode(ev, event.EncodingJSON)
	if err != nil {
		t.Fatal(err)
	}
	dl := deadletter.PubSub(m, "p", "shop.order.events.member-service-processor", 5)
	dl.ID = "dl-redacted"
	e.archiveDelivery(t, dl)

	var shown archive.Letter
	if code := e.call(t, "GET", "/deadletters/dl-redacted", nil, &shown); code != 200 {
		t.Fatalf("get the letter: %d", code)
	}
	if fmt.Sprint(shown.RedactedFields) != "[/email]" || strings.Contains(string(shown.Data), "carol@") ||
		!strings.Contains(string(shown.Data), key.HashValue("carol@example.com")) {
		t.Errorf("letter as shown: redactedFields %v, data %s; want the email hashed", shown.RedactedFields, shown.Data)
	}
	if !testing.Short() { // the console marks the letter redacted
		b := newBrowser(t, e.url+"/console/")
		b.open("/deadletters/dl-redacted")
		b.waitFor("the letter's privacy note", `/Redacted by the topic's privacy rule: \/email/.test(document.querySelector("[data-testid=privacy]")?.textContent || "")`, 20*time.Second)
	}
	var apiErr struct{ Code, Message string }
	if code := e.call(t, "POST", "/deadletters/dl-redacted:replay", nil, &apiErr); code != 409 || apiErr.Code != "payload_redacted" ||
		!strings.Contains(apiErr.Message, "evt-r1") {
		t.Errorf("replay of a redacted letter: %d %+v, want 409 payload_redacted naming the event to re-push", code, apiErr)
	}
	var batch map[string]any
	if code := e.call(t, "POST", "/deadletters:replay", map[string]any{"topic": "shop.order.events"}, &batch); code != 200 ||
		batch["replayed"] != float64(0) || batch["skippedRedacted"] != float64(1) || batch["remaining"] != float64(0) {
		t.Errorf("batch replay: %d %v, want the redacted letter skipped", code, batch)
	}
	if got := receive(t, e, "shop.order.events.member-service-processor"); len(got) != 0 {
		t.Errorf("member-service received %d messages; a redacted letter must not be delivered", len(got))
	}
}
