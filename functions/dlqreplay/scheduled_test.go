package dlqreplay_test

import (
	"context"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

// GET /scheduled lists the outbox's scheduled events; POST
// /scheduled/{id}:cancel cancels one before it is due, with an audit
// entry, and answers 409 naming the rule for one it may not cancel.
func TestScheduledListAndCancel(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, dlqreplay.AuthNone, "")
	mk := func(id string, version int64, at time.Time) *event.Event {
		return &event.Event{ID: id, Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
			AggregateID: "order-s", Version: version, Payload: []byte(`{}`), DeliverAt: at}
	}
	due := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	if _, err := outbox.Enqueue(ctx, e.db, mk("evt-s1", 1, due), mk("evt-s2", 2, due.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	var list struct {
		Scheduled []struct {
			EventID   string    `json:"eventId"`
			DeliverAt time.Time `json:"deliverAt"`
			Version   int64     `json:"version"`
		} `json:"scheduled"`
	}
	if code := e.call(t, "GET", "/scheduled", nil, &list); code != 200 || len(list.Scheduled) != 2 ||
		list.Scheduled[0].EventID != "evt-s1" || !list.Scheduled[0].DeliverAt.Equal(due) {
		t.Fatalf("GET /scheduled: %d %+v", code, list)
	}
	var apiErr struct{ Code, Message string }
	if code := e.call(t, "POST", "/scheduled/evt-s2:cancel", map[string]string{"reason": "x"}, &apiErr); code != 409 || apiErr.Code != "not_cancellable" {
		t.Errorf("cancel behind an unpublished version: %d %+v, want 409 not_cancellable", code, apiErr)
	}
	if code := e.call(t, "POST", "/scheduled/nope:cancel", nil, &apiErr); code != 404 {
		t.Errorf("cancel of an unknown event: %d", code)
	}
	var res map[string]any
	if code := e.call(t, "POST", "/scheduled/evt-s1:cancel", map[string]string{"reason": "customer withdrew"}, &res); code != 200 || res["state"] != "cancelled" {
		t.Fatalf("cancel: %d %v", code, res)
	}
	if code := e.call(t, "GET", "/scheduled", nil, &list); code != 200 || len(list.Scheduled) != 1 || list.Scheduled[0].EventID != "evt-s2" {
		t.Fatalf("after the cancel: %d %+v", code, list)
	}
	var audit struct {
		Entries []struct {
			Action, EventID, Outcome string
		} `json:"entries"`
	}
	if code := e.call(t, "GET", "/audit?action=event.cancel&outcome=succeeded", nil, &audit); code != 200 || len(audit.Entries) != 1 || audit.Entries[0].EventID != "evt-s1" {
		t.Errorf("audit: %d %+v", code, audit)
	}
	got, err := outbox.Lookup(ctx, e.db, "evt-s1")
	if err != nil || got["evt-s1"].State != outbox.StateCancelled {
		t.Errorf("outbox state: %+v %v", got, err)
	}
}
