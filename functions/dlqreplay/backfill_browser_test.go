package dlqreplay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/history"
)

// The console's Backfills page lists a backfill with its state, its
// events queued of those it matched, its rate and ETA, and pauses,
// resumes and cancels it over the API: the backfill's row in the outbox
// database says so after each.
func TestConsoleControlsABackfill(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test starts Chromium")
	}
	ctx := context.Background()
	e := newEnv(t, dlqreplay.AuthNone, "")
	published(t, e, 4, "o-1", "o-2", "o-3")
	spec := history.Spec{Topic: "shop.order.events", Consumer: "member-service", Since: time.Now().Add(-time.Hour), Until: time.Now(), Rate: 500, By: "test"}
	id := history.NewID(time.Now())
	if _, err := history.Start(ctx, e.db, id, spec); err != nil {
		t.Fatal(err)
	}
	if bf, n, err := history.Step(ctx, e.db, id, 5); err != nil || n != 5 {
		t.Fatalf("step: %d queued, %+v %v", n, bf, err)
	}
	row := fmt.Sprintf("[data-testid=backfill-row][data-backfill-id=%q]", id)
	stateIs := func(want string) {
		t.Helper()
		if bf, err := history.Get(ctx, e.db, id); err != nil || bf.State != want {
			t.Fatalf("the backfill is %q (%v), want %s", bf.State, err, want)
		}
	}

	b := newBrowser(t, e.url+"/console/")
	b.open("/backfills")
	b.waitFor("the backfill's row", fmt.Sprintf(`!!document.querySelector(%q)`, row), 20*time.Second)
	if got := b.text(row + " [data-testid=backfill-state]"); got != "running" {
		t.Errorf("its state reads %q, want running", got)
	}
	if got := b.text(row + " [data-testid=backfill-done]"); got != "5/12 (41%)" {
		t.Errorf("its progress reads %q, want 5/12 (41%%)", got)
	}
	if got := b.text(row + " [data-testid=backfill-rate]"); got == "–" || got == "" {
		t.Errorf("its rate reads %q, want the measured rate", got)
	}
	if got := b.text(row + " [data-testid=backfill-eta]"); got == "" {
		t.Error("its ETA is empty while it runs")
	}
	b.shot("backfills")

	b.click(row + " [data-testid=backfill-pause]")
	b.waitFor("paused", fmt.Sprintf(`document.querySelector(%q)?.textContent === "paused" && !!document.querySelector(%q)`,
		row+" [data-testid=backfill-state]", row+" [data-testid=backfill-resume]"), 20*time.Second)
	stateIs(history.StatePaused)

	b.click(row + " [data-testid=backfill-resume]")
	b.waitFor("running again", fmt.Sprintf(`document.querySelector(%q)?.textContent === "running" && !!document.querySelector(%q)`,
		row+" [data-testid=backfill-state]", row+" [data-testid=backfill-pause]"), 20*time.Second)
	stateIs(history.StateRunning)

	b.click(row + " [data-testid=backfill-cancel]")
	b.waitFor("the cancel confirmation", `document.getElementById("confirm").open`, 10*time.Second)
	b.click("#confirm-ok")
	b.waitFor("cancelled, without buttons", fmt.Sprintf(`document.querySelector(%q)?.textContent === "cancelled" && !document.querySelector(%q + " button")`,
		row+" [data-testid=backfill-state]", row), 20*time.Second)
	if got := b.text("[data-testid=backfill-result]"); got != "Backfill "+id+" is cancelled." {
		t.Errorf("the notice reads %q", got)
	}
	stateIs(history.StateCancelled)
	if bf, _ := history.Get(ctx, e.db, id); bf.Queued != 5 {
		t.Errorf("the cancelled backfill queued %d, want the 5 it had", bf.Queued)
	}
}
