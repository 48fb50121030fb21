package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/inbox"
)

// Who paused a push consumer decides who may resume it: the breaker's
// record yields to an operator's (which the breaker's resume leaves
// alone), an operator's pause that comes while the breaker's resume runs
// waits for it and stands after it, and a failed probe pushes the next one
// back.
func TestPushPauseRecord(t *testing.T) {
	ctx := context.Background()
	db := migrated(t)
	const sub = "shop.order.events.archive-service-forwarder"
	rec := inbox.PushPause{Subscription: sub, ConsumerID: "archive-service", Endpoint: "https://consume.example/", ServiceAccount: "sa@example.com",
		Audience: "https://consume.example", Reason: "answered 503", ProbeAfter: time.Now().Add(time.Minute)}
	state := func() (inbox.PushPause, bool) {
		t.Helper()
		p, ok, err := inbox.PushPauseOf(ctx, db, sub)
		if err != nil {
			t.Fatal(err)
		}
		return p, ok
	}
	resumes := 0
	resume := func(context.Context, inbox.PushPause) error { resumes++; return nil }

	if ok, err := inbox.PauseByBreaker(ctx, db, rec); err != nil || !ok {
		t.Fatalf("the breaker's pause: %v, %v", ok, err)
	}
	if ok, err := inbox.PauseByBreaker(ctx, db, rec); err != nil || ok {
		t.Fatalf("the breaker's pause again: recorded %v, %v; want not", ok, err)
	}
	next := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second)
	if err := inbox.BreakerProbeFailed(ctx, db, sub, next, "no answer"); err != nil {
		t.Fatal(err)
	}
	if p, ok := state(); !ok || p.By != inbox.PausedByBreaker || p.Endpoint != rec.Endpoint || p.FailedProbes != 1 || !p.ProbeAfter.Equal(next) || p.Reason != "no answer" {
		t.Fatalf("after a failed probe: %+v %v", p, ok)
	}

	// An operator pauses it too: the pause is theirs, the breaker's resume
	// does nothing.
	if err := inbox.PauseByOperator(ctx, db, sub, "archive-service", "alice@example.com"); err != nil {
		t.Fatal(err)
	}
	if ok, err := inbox.ResumeBreakerPause(ctx, db, sub, resume); err != nil || ok || resumes != 0 {
		t.Fatalf("the breaker's resume of an operator's pause: %v, %v, %d calls; want none", ok, err, resumes)
	}
	if err := inbox.BreakerProbeFailed(ctx, db, sub, next.Add(time.Hour), "x"); err != nil {
		t.Fatal(err)
	}
	if p, ok := state(); !ok || p.By != inbox.PausedByOperator || p.Who != "alice@example.com" || !p.ProbeAfter.Before(next.Add(time.Hour)) {
		t.Fatalf("operator's pause: %+v %v", p, ok)
	}
	// Their resume lifts it.
	if err := inbox.ClearPushPause(ctx, db, sub, ""); err != nil {
		t.Fatal(err)
	}
	if _, ok := state(); ok {
		t.Fatal("record left after the operator's resume")
	}
	if ok, err := inbox.ResumeBreakerPause(ctx, db, sub, resume); err != nil || ok {
		t.Fatalf("the breaker's resume with nothing paused: %v, %v", ok, err)
	}

	// The breaker's pause, resumed while an operator pauses: the operator's
	// record waits for the resume's transaction and stands after it.
	if ok, err := inbox.PauseByBreaker(ctx, db, rec); err != nil || !ok {
		t.Fatalf("the breaker's pause: %v, %v", ok, err)
	}
	done := make(chan error, 1)
	ok, err := inbox.ResumeBreakerPause(ctx, db, sub, func(ctx context.Context, p inbox.PushPause) error {
		if p.Endpoint != rec.Endpoint || p.ServiceAccount != rec.ServiceAccount || p.Audience != rec.Audience {
			t.Errorf("resume got %+v, want the endpoint the breaker detached", p)
		}
		go func() { done <- inbox.PauseByOperator(ctx, db, sub, "archive-service", "bob@example.com") }()
		// The operator's insert waits on the record's lock until this
		// transaction ends.
		eventually.True(t, 10*time.Second, "the operator's pause waits on the record's lock", func() bool {
			return count(t, db, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%relaybus_inbox_push_pause%'`) > 0
		})
		select {
		case err := <-done:
			t.Errorf("the operator's pause finished during the breaker's resume (%v)", err)
		default:
		}
		return nil
	})
	if err != nil || !ok {
		t.Fatalf("the breaker's resume: %v, %v", ok, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if p, ok := state(); !ok || p.By != inbox.PausedByOperator || p.Who != "bob@example.com" {
		t.Fatalf("after the operator paused during the breaker's resume: %+v %v, want the operator's pause", p, ok)
	}
}
