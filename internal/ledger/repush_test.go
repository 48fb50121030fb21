package ledger

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/shared/event"
)

func TestRepush(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, Options{})
	seed(t, s, orderTopic, "member-service", "message-service")
	e := newEventOn(t, orderTopic, "order.purchased", time.Now())
	if err := s.RecordSent(ctx, model.SentAt(time.Now(), e)); err != nil {
		t.Fatal(err)
	}
	for _, a := range []model.Attempt{attempt(e, "member-service", 1, model.OutcomeSuccess), attempt(e, "message-service", 1, model.OutcomeFailed)} {
		if _, err := s.InsertAttempt(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if res, _ := s.Rollup(ctx, e.ID); res.Status != model.StatusPartial {
		t.Fatalf("status %s", res.Status)
	}

	// check refuses: its error comes back as is and nothing changes.
	refused := errors.New("not re-pushable")
	var seen model.Event
	_, err := s.BeginRepush(ctx, e.ID, "message-service", func(ev model.Event) error { seen = ev; return refused }, time.Now())
	if err != refused { //nolint:errorlint // the check's error as is, not wrapped
		t.Fatalf("err %v, want check's error as is", err)
	}
	if seen.Status != model.StatusPartial || seen.EventID != e.ID {
		t.Errorf("check saw %+v", seen)
	}
	if got := mustGet(t, s, e.ID).Event; got.Status != model.StatusPartial || got.RetryCount != 0 || got.Repush != nil {
		t.Errorf("refused re-push changed the event: %+v", got)
	}

	// Accepted: RETRYING, retryCount+1, lastSentAt.
	at := time.Now().UTC().Truncate(time.Microsecond)
	ev, err := s.BeginRepush(ctx, e.ID, "message-service", func(ev model.Event) error { return nil }, at)
	if err != nil {
		t.Fatal(err)
	}
	stored := mustGet(t, s, e.ID)
	for _, got := range []model.Event{ev, stored.Event} {
		if got.Status != model.StatusRetrying || got.RetryCount != 1 || !got.LastSentAt.Equal(at) || !got.StatusAt.Equal(at) ||
			got.Repush == nil || got.Repush.Consumer != "message-service" || len(got.Repush.Since) != 1 || got.Repush.Since[0] != (model.ConsumerMark{ConsumerID: "message-service", AttemptNo: 1}) {
			t.Errorf("after BeginRepush: %+v repush %+v", got, got.Repush)
		}
	}
	if !stored.Consumers[1].RepushPending || stored.Consumers[0].RepushPending {
		t.Errorf("repush pending flags %+v", stored.Consumers)
	}
	// A notice from elsewhere (member-service re-recording) keeps RETRYING:
	// message-service has not answered the re-push.
	if res, err := s.Rollup(ctx, e.ID); err != nil || res.Status != model.StatusRetrying || res.Changed {
		t.Errorf("rollup during the re-push: %+v %v", res, err)
	}
	// message-service answers: the status is derived again.
	if _, err := s.InsertAttempt(ctx, attempt(e, "message-service", 2, model.OutcomeSuccess)); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Rollup(ctx, e.ID); err != nil || res.Status != model.StatusConsumed {
		t.Errorf("after the re-push was consumed: %+v %v", res, err)
	}

	// A second re-push to everyone whose publish the relay gives up on:
	// the status falls back to what the attempts say.
	if _, err := s.BeginRepush(ctx, e.ID, "", nil, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, e.ID).Event; got.Status != model.StatusRetrying || got.RetryCount != 2 || len(got.Repush.Since) != 2 {
		t.Fatalf("second re-push: %+v", got)
	}
	if err := s.RecordPublishFailure(ctx, e, 5, "permission denied", true, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, e.ID).Event; got.Status != model.StatusConsumed || !got.Repush.PublishFailed {
		t.Errorf("after the re-push could not be published: %s %+v", got.Status, got.Repush)
	}

	if _, err := s.BeginRepush(ctx, "missing", "", nil, time.Now()); !errors.Is(err, model.ErrEventNotFound) {
		t.Errorf("unknown event: %v", err)
	}
	if _, err := s.BeginRepush(ctx, e.ID, "Not A Consumer", nil, time.Now()); !errors.Is(err, event.ErrInvalid) {
		t.Errorf("bad consumer: %v", err)
	}
}

func TestExpire(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{t: time.Date(2024, 2, 28, 10, 0, 0, 0, time.UTC)}
	s := newStore(t, Options{Now: clock.now})
	seed(t, s, orderTopic, "member-service")
	mk := func(ttl time.Duration) *event.Event {
		e := newEventOn(t, orderTopic, "order.purchased", clock.t)
		if ttl > 0 {
			e.ExpireAt = clock.t.Add(ttl)
		}
		return e
	}
	silent := mk(time.Hour)      // nobody ever reports
	consumed := mk(time.Hour)    // consumed in time
	failing := mk(time.Hour)     // its consumer keeps failing
	later := mk(3 * time.Hour)   // expires later
	forever := mk(0)             // no expiry
	neverSent := mk(time.Minute) // the relay never managed to publish it
	if err := s.RecordSent(ctx, model.SentAt(clock.t, silent, consumed, failing, later, forever)); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordPublishFailure(ctx, neverSent, 1, "unavailable", false, clock.t); err != nil {
		t.Fatal(err)
	}
	_, _ = s.InsertAttempt(ctx, attempt(consumed, "member-service", 1, model.OutcomeSuccess))
	_, _ = s.InsertAttempt(ctx, attempt(failing, "member-service", 1, model.OutcomeRetry))
	for _, e := range []*event.Event{consumed, failing} {
		if _, err := s.Rollup(ctx, e.ID); err != nil {
			t.Fatal(err)
		}
	}
	if rep, err := s.ExpireDue(ctx, 0); err != nil || rep.Due != 0 {
		t.Fatalf("nothing is due yet: %+v %v", rep, err)
	}

	clock.t = clock.t.Add(2 * time.Hour)
	rep, err := s.ExpireDue(ctx, 0)
	if err != nil || rep.Due != 3 || rep.Expired != 3 || rep.More {
		t.Errorf("sweep: %+v %v (want silent, failing and neverSent expired)", rep, err)
	}
	want := map[*event.Event]model.Status{silent: model.StatusExpired, failing: model.StatusExpired, neverSent: model.StatusExpired, consumed: model.StatusConsumed, later: model.StatusSent, forever: model.StatusSent}
	for e, st := range want {
		got := mustGet(t, s, e.ID).Event
		if got.Status != st {
			t.Errorf("%s: %s, want %s", e.ID, got.Status, st)
		}
		if got.Status == model.StatusExpired && (!got.ExpireDue.IsZero() || !got.StatusAt.Equal(clock.t)) {
			t.Errorf("expired event still due or statusAt %v", got.StatusAt)
		}
	}
	// Swept events leave the index: the next sweep finds nothing.
	if rep, err := s.ExpireDue(ctx, 0); err != nil || rep.Due != 0 {
		t.Errorf("second sweep %+v %v", rep, err)
	}
	// A notice for an expired event keeps it EXPIRED, unless its consumer
	// did succeed after all.
	_, _ = s.InsertAttempt(ctx, attempt(failing, "member-service", 2, model.OutcomeSuccess))
	if res, _ := s.Rollup(ctx, failing.ID); res.Status != model.StatusConsumed {
		t.Errorf("late success: %s", res.Status)
	}
	// Batches: limit 1 leaves More.
	clock.t = clock.t.Add(2 * time.Hour)
	rep, err = s.ExpireDue(ctx, 1)
	if err != nil || rep.Due != 1 || !rep.More {
		t.Errorf("limited sweep %+v %v", rep, err)
	}
}
