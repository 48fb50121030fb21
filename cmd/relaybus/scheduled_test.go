package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

// relaybus scheduled ls lists a scheduled event; scheduled cancel cancels
// it (and the outbox says so); a second event behind an unpublished one
// is refused with the rule.
func TestScheduledCommands(t *testing.T) {
	ctx := context.Background()
	top, store, pool, fake := cliBackends(t)
	due := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	mk := func(id string, v int64) *event.Event {
		return &event.Event{ID: id, Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
			AggregateID: "order-9", Version: v, Payload: []byte(`{}`), DeliverAt: due.Add(time.Duration(v) * time.Minute)}
	}
	if _, err := outbox.Enqueue(ctx, pool, mk("evt-later-1", 1), mk("evt-later-2", 2)); err != nil {
		t.Fatal(err)
	}
	h, err := dlqreplay.New(dlqreplay.Options{Archive: archive.New(store.Client()), Ledger: store, DB: pool, Publisher: fake.Client,
		Topology: top, Auth: dlqreplay.AuthNone, Writers: []string{dlqreplay.Anonymous}, RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	cli := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(ctx, append([]string{"--api", srv.URL}, args...), &out, &errOut, http.DefaultClient)
		return code, out.String(), errOut.String()
	}
	code, out, errOut := cli("scheduled", "ls")
	if code != 0 || !strings.Contains(out, "evt-later-1") || !strings.Contains(out, due.Add(time.Minute).Format(time.RFC3339)) ||
		!strings.Contains(out, "waiting") {
		t.Fatalf("scheduled ls: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := cli("scheduled", "cancel", "evt-later-2"); code != 1 || !strings.Contains(out+errOut, "not_cancellable") {
		t.Errorf("cancel behind an unpublished version: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := cli("scheduled", "cancel", "--reason", "withdrawn", "evt-later-1"); code != 0 || !strings.Contains(out, "cancelled") {
		t.Fatalf("scheduled cancel: exit %d\n%s%s", code, out, errOut)
	}
	got, err := outbox.Lookup(ctx, pool, "evt-later-1")
	if err != nil || got["evt-later-1"].State != outbox.StateCancelled {
		t.Fatalf("outbox: %+v %v", got, err)
	}
	if code, out, _ := cli("scheduled", "ls"); code != 0 || strings.Contains(out, "evt-later-1") || !strings.Contains(out, "evt-later-2") {
		t.Errorf("after the cancel: exit %d\n%s", code, out)
	}
}
