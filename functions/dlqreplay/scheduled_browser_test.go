package dlqreplay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

// The console's Scheduled page lists a scheduled event and cancels it
// through the confirmation dialog, with a reason; the outbox then says
// cancelled and the page no longer lists it.
func TestConsoleCancelsAScheduledEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test starts Chromium")
	}
	ctx := context.Background()
	e := newEnv(t, dlqreplay.AuthNone, "")
	at := time.Now().Add(time.Hour)
	mk := func(id string, v int64) *event.Event {
		return &event.Event{ID: id, Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
			AggregateID: "order-b", Version: v, Payload: []byte(`{}`), DeliverAt: at.Add(time.Duration(v) * time.Minute)}
	}
	if _, err := outbox.Enqueue(ctx, e.db, mk("evt-b1", 1), mk("evt-b2", 2)); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, e.url+"/console/")
	b.open("/scheduled")
	row := func(id string) string { return fmt.Sprintf("[data-testid=scheduled-row][data-event-id=%q]", id) }
	b.waitFor("both scheduled events", fmt.Sprintf(`!!document.querySelector(%q) && !!document.querySelector(%q)`, row("evt-b1"), row("evt-b2")), 20*time.Second)
	if got := b.text(row("evt-b1") + " [data-testid=scheduled-state]"); got != "waiting" {
		t.Errorf("evt-b1's state reads %q, want waiting", got)
	}
	b.shot("scheduled")
	b.click(row("evt-b1") + " [data-testid=cancel-scheduled]")
	b.waitFor("the cancel confirmation", `document.getElementById("confirm").open`, 10*time.Second)
	b.run("give a reason", 10*time.Second, chromedp.SendKeys("[data-testid=cancel-reason]", "customer withdrew (INC-9)", chromedp.ByQuery))
	b.click("#confirm-ok")
	b.waitFor("the cancel's notice", `/Cancelled evt-b1/.test(document.querySelector("[data-testid=scheduled-result]")?.textContent || "")`, 20*time.Second)
	b.waitFor("evt-b1 gone from the list", fmt.Sprintf(`!document.querySelector(%q) && !!document.querySelector(%q)`, row("evt-b1"), row("evt-b2")), 20*time.Second)
	got, err := outbox.Lookup(ctx, e.db, "evt-b1")
	if err != nil || got["evt-b1"].State != outbox.StateCancelled {
		t.Fatalf("the outbox says %+v (%v), want cancelled", got["evt-b1"], err)
	}
}
