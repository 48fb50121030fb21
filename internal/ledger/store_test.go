package ledger

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
)

const orderTopic = "shop.order.events"

func mustGet(t *testing.T, s *testStore, id string) query.Detail {
	t.Helper()
	d, err := s.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestRecordSentCreatesTheEventOnceAndNeverDowngrades(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, Options{})
	seed(t, s, orderTopic, "member-service", "message-service")
	at := time.Now().UTC().Truncate(time.Second)
	e := newEventOn(t, orderTopic, "order.purchased", at.Add(-time.Second))
	e.ExpireAt = at.Add(24 * time.Hour)
	e.SpanID, e.CorrelationID = "span-001", "corr-1"

	if err := s.RecordSent(ctx, model.SentAt(at, e, e)); err != nil {
		t.Fatal(err)
	}
	d := mustGet(t, s, e.ID)
	got := d.Event
	if got.Status != model.StatusSent || !got.SentAt.Equal(at) || !got.LastSentAt.Equal(at) || !got.StatusAt.Equal(at) || got.RetryCount != 0 {
		t.Errorf("send state: %+v", got)
	}
	if strings.Join(got.ExpectedConsumers, ",") != "member-service,message-service" {
		t.Errorf("expected consumers %v", got.ExpectedConsumers)
	}
	env, err := got.Envelope()
	if err != nil {
		t.Fatal(err)
	}
	want := *e
	want.OccurredAt, want.ExpireAt = e.OccurredAt.Truncate(time.Microsecond), e.ExpireAt.Truncate(time.Microsecond)
	if !equalEvents(env, want) {
		t.Errorf("envelope changed in the ledger:\n got %+v\nwant %+v", env, want)
	}
	if d.Summary() != "0/2 consumed" {
		t.Errorf("summary %q", d.Summary())
	}

	// The consumers finish; a replayed RecordSent (relay re-run) leaves the
	// document exactly as it is.
	for _, c := range []string{"member-service", "message-service"} {
		if _, err := s.InsertAttempt(ctx, attempt(e, c, 1, model.OutcomeSuccess)); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := s.Rollup(ctx, e.ID); err != nil || res.Status != model.StatusConsumed || !res.Changed {
		t.Fatalf("rollup %+v %v", res, err)
	}
	before := mustGet(t, s, e.ID).Event
	if err := s.RecordSent(ctx, model.SentAt(at.Add(time.Minute), e)); err != nil {
		t.Fatal(err)
	}
	after := mustGet(t, s, e.ID).Event
	if after.Status != model.StatusConsumed || !after.UpdatedAt.Equal(before.UpdatedAt) || !after.LastSentAt.Equal(at) {
		t.Errorf("replayed RecordSent changed the document: before %+v after %+v", before, after)
	}
	if !after.ExpireDue.IsZero() {
		t.Error("a CONSUMED event is still in the expiry index")
	}
}

func equalEvents(a, b event.Event) bool {
	return a.ID == b.ID && a.Type == b.Type && a.Source == b.Source && a.Topic == b.Topic &&
		a.AggregateType == b.AggregateType && a.AggregateID == b.AggregateID && a.Version == b.Version &&
		a.OccurredAt.Equal(b.OccurredAt) && a.SchemaVersion == b.SchemaVersion && a.PayloadType == b.PayloadType &&
		string(a.Payload) == string(b.Payload) && a.TraceID == b.TraceID && a.SpanID == b.SpanID &&
		a.ParentEventID == b.ParentEventID && a.CorrelationID == b.CorrelationID && a.Initiator == b.Initiator &&
		a.ExpireAt.Equal(b.ExpireAt)
}

func TestPublishFailureThenSend(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, Options{})
	seed(t, s, orderTopic, "member-service")
	at := time.Now().UTC().Truncate(time.Microsecond) // Firestore keeps microseconds
	e := newEventOn(t, orderTopic, "order.purchased", at)

	if err := s.RecordPublishFailure(ctx, e, 1, "pubsub: permission denied", false, at); err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, s, e.ID).Event
	if got.Status != model.StatusPending || got.PublishFailure == nil || got.PublishFailure.Attempts != 1 || !got.SentAt.IsZero() {
		t.Fatalf("after a failed publish: %+v", got)
	}
	if err := s.RecordPublishFailure(ctx, e, 5, strings.Repeat("x", 10000), true, at.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	got = mustGet(t, s, e.ID).Event
	if got.Status != model.StatusFailed || !got.PublishFailure.Final || len(got.PublishFailure.LastError) > model.MaxErrorText {
		t.Fatalf("after the relay gave up: status %s %+v", got.Status, got.PublishFailure)
	}
	// An operator fixes the topic and the relay publishes after all.
	sent := at.Add(time.Hour)
	if err := s.RecordSent(ctx, model.SentAt(sent, e)); err != nil {
		t.Fatal(err)
	}
	got = mustGet(t, s, e.ID).Event
	if got.Status != model.StatusSent || !got.SentAt.Equal(sent) || !got.LastSentAt.Equal(sent) || !got.StatusAt.Equal(sent) || len(got.ExpectedConsumers) != 1 {
		t.Fatalf("send after failures: %+v", got)
	}
	if got.PublishFailure == nil {
		t.Error("publish failure history lost")
	}
	// A failure to re-publish an event that was sent does not change its status.
	if err := s.RecordPublishFailure(ctx, e, 1, "later", false, sent.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, e.ID).Event; got.Status != model.StatusSent || got.PublishFailure.LastError != "later" {
		t.Errorf("after a failed re-publish: %s %+v", got.Status, got.PublishFailure)
	}
}

func TestPublishFailureAfterConsumersReportedKeepsTheirStatus(t *testing.T) {
	// The relay's publish timed out but the message went through: the
	// consumers report, then the relay records the failure it saw.
	ctx := context.Background()
	s := newStore(t, Options{})
	seed(t, s, orderTopic, "member-service")
	e := newEventOn(t, orderTopic, "order.purchased", time.Now())
	if _, err := s.InsertAttempt(ctx, attempt(e, "member-service", 1, model.OutcomeSuccess)); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordPublishFailure(ctx, e, 1, "deadline exceeded", false, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, e.ID).Event; got.Status != model.StatusConsumed {
		t.Errorf("status %s, want CONSUMED (the consumer's attempt is the truth)", got.Status)
	}
}

func TestInsertAttemptIsInsertOnly(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, Options{})
	e := newEventOn(t, orderTopic, "order.purchased", time.Now())
	a := attempt(e, "message-service", 1, model.OutcomeRetry)
	a.ErrorCode, a.ErrorMessage = "timeout", "smtp timed out"
	if created, err := s.InsertAttempt(ctx, a); err != nil || !created {
		t.Fatal(created, err)
	}
	changed := a
	changed.ErrorMessage = "something else"
	if created, err := s.InsertAttempt(ctx, changed); err != nil || created {
		t.Fatalf("second insert of the same attempt: created=%v err=%v", created, err)
	}
	as, err := s.readAttempts(ctx, nil, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 1 || as[0].ErrorMessage != "smtp timed out" || as[0].CreatedAt.IsZero() || as[0].ConsumedAt.IsZero() {
		t.Errorf("attempts %+v", as)
	}
	// Bad attempts are refused with the field named.
	_, err = s.InsertAttempt(ctx, model.Attempt{EventID: e.ID, ConsumerID: "message-service", AttemptNo: 0, Outcome: model.OutcomeSuccess, Success: true})
	if !errors.Is(err, event.ErrInvalid) || strings.Join(fieldErrs(err), ",") != "attemptNo" {
		t.Errorf("attempt 0: %v", err)
	}
}

func TestRollupOfAnUnknownEvent(t *testing.T) {
	s := newStore(t, Options{})
	_, err := s.Rollup(context.Background(), "no-such-event")
	if !errors.Is(err, model.ErrEventNotFound) {
		t.Errorf("err = %v, want ErrEventNotFound", err)
	}
	if _, err := s.Rollup(context.Background(), "bad/id"); !errors.Is(err, event.ErrInvalid) {
		t.Errorf("bad id: %v", err)
	}
}

// The event keeps the consumers it was sent to whatever the registry says
// later (end to end on the emulator; the table test covers the rules).
func TestExpectedConsumersAreFixedAtSend(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, Options{Registry: nil})
	seed(t, s, orderTopic, "member-service", "message-service")
	// No cache in front, so the registry change below is seen at once.
	s.reg = s
	early := newEventOn(t, orderTopic, "order.purchased", time.Now())
	if err := s.RecordSent(ctx, model.SentAt(time.Now(), early)); err != nil {
		t.Fatal(err)
	}
	// message-service is disabled, audit-service added.
	if _, err := s.SyncConsumers(ctx, []registry.Consumer{
		{Topic: orderTopic, ConsumerID: "member-service", Enabled: true, SortOrder: 1},
		{Topic: orderTopic, ConsumerID: "message-service", Enabled: false, SortOrder: 2},
		{Topic: orderTopic, ConsumerID: "audit-service", Enabled: true, SortOrder: 3},
	}, consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	late := newEventOn(t, orderTopic, "order.purchased", time.Now())
	if err := s.RecordSent(ctx, model.SentAt(time.Now(), late)); err != nil {
		t.Fatal(err)
	}
	for _, e := range []*event.Event{early, late} {
		for _, c := range []string{"member-service", "audit-service"} {
			if _, err := s.InsertAttempt(ctx, attempt(e, c, 1, model.OutcomeSuccess)); err != nil {
				t.Fatal(err)
			}
		}
	}
	res, err := s.Rollup(ctx, early.ID)
	if err != nil || res.Status != model.StatusSent || res.Expected != 2 || res.Succeeded != 1 {
		t.Errorf("early event (waits for message-service, ignores audit-service): %+v %v", res, err)
	}
	res, err = s.Rollup(ctx, late.ID)
	if err != nil || res.Status != model.StatusConsumed || res.Expected != 2 {
		t.Errorf("late event: %+v %v", res, err)
	}
	d := mustGet(t, s, early.ID)
	if d.Summary() != "1/2 consumed" || len(d.Consumers) != 3 || d.Consumers[2].ConsumerID != "audit-service" || d.Consumers[2].Expected {
		t.Errorf("early detail %s %+v", d.Summary(), d.Consumers)
	}
}

func TestPayloadTooLargeForTheLedgerIsOmitted(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, Options{MaxStoredPayload: 1024})
	seed(t, s, orderTopic, "member-service")
	e := newEventOn(t, orderTopic, "order.purchased", time.Now())
	e.Payload = []byte(`"` + strings.Repeat("x", 2000) + `"`)
	if err := s.RecordSent(ctx, model.SentAt(time.Now(), e)); err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, s, e.ID).Event
	if !got.PayloadOmitted || got.PayloadSize != len(e.Payload) || got.Payload != nil {
		t.Errorf("omitted=%v size=%d stored=%d", got.PayloadOmitted, got.PayloadSize, len(got.Payload))
	}
	if _, err := got.Envelope(); !errors.Is(err, model.ErrPayloadOmitted) {
		t.Errorf("Envelope: %v", err)
	}
}

// Every event and attempt document carries deleteAt (created at +
// Retention), the field Firestore's TTL policies delete by; a negative
// Retention keeps documents (no deleteAt).
func TestDocumentsCarryTheirTTL(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		retention time.Duration
		want      time.Time
	}{
		{0, now.Add(DefaultRetention)},
		{48 * time.Hour, now.Add(48 * time.Hour)},
		{-1, time.Time{}},
	} {
		s := newStore(t, Options{Now: func() time.Time { return now }, Retention: c.retention})
		seed(t, s, orderTopic, "member-service")
		e := newEventOn(t, orderTopic, "order.purchased", now)
		if err := s.RecordSent(ctx, model.SentAt(now, e)); err != nil {
			t.Fatal(err)
		}
		if err := s.InsertAttempts(ctx, []model.Attempt{attempt(e, "member-service", 1, model.OutcomeSuccess)}); err != nil {
			t.Fatal(err)
		}
		ev, err := s.Client().Collection(model.CollectionEvents).Doc(model.EventDocID(e.ID)).Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		at, err := s.Client().Collection(model.CollectionEvents).Doc(model.EventDocID(e.ID)).Collection(model.CollectionConsumptions).
			Doc(model.AttemptDocID(e.ID, "member-service", 1)).Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for name, snap := range map[string]*firestore.DocumentSnapshot{"event": ev, "attempt": at} {
			got, ok := snap.Data()["deleteAt"].(time.Time)
			switch {
			case c.want.IsZero() && ok:
				t.Errorf("retention %v: the %s has deleteAt %v, want none", c.retention, name, got)
			case !c.want.IsZero() && (!ok || !got.Equal(c.want)):
				t.Errorf("retention %v: the %s's deleteAt is %v (%v), want %v", c.retention, name, got, ok, c.want)
			}
		}
	}
}

func TestOpenModeRefusesUnknownModes(t *testing.T) {
	if s, err := OpenMode(context.Background(), ModeOff, Config{}, Options{}); s != nil || err != nil {
		t.Errorf("off: %v %v, want no store and no error", s, err)
	}
	if _, err := OpenMode(context.Background(), "postgres", Config{}, Options{}); err == nil || !strings.Contains(err.Error(), `LEDGER="postgres"`) {
		t.Errorf("unknown mode: %v", err)
	}
}
