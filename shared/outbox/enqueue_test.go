package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func newDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.Schema(t)
	if err := outbox.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

func ev(id, agg string, version int64) *event.Event {
	return &event.Event{ID: id, Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
		AggregateID: agg, Version: version, Payload: []byte(`{"n":1}`),
		Initiator: event.Initiator{Service: "order-service", UserID: "u1"}}
}

func count(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM relaybus_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestEnqueueFollowsTheCallersTransaction(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	tx, _ := pool.Begin(ctx)
	if _, err := outbox.Enqueue(ctx, tx, ev("e1", "A", 1)); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if n := count(t, pool); n != 0 {
		t.Fatalf("rolled-back enqueue left %d rows", n)
	}
	tx, _ = pool.Begin(ctx)
	res, err := outbox.Enqueue(ctx, tx, ev("e1", "A", 1), ev("e2", "A", 2))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool); n != 2 || res[0].Duplicate || res[1].State != outbox.StatePending {
		t.Fatalf("rows %d, result %+v", n, res)
	}
	var trace, initiator string
	_ = pool.QueryRow(ctx, `SELECT trace_id, initiator->>'userId' FROM relaybus_outbox WHERE id = 'e1'`).Scan(&trace, &initiator)
	if len(trace) != 32 || initiator != "u1" {
		t.Errorf("envelope not stored: trace %q initiator %q", trace, initiator)
	}
}

func TestEnqueueIsIdempotentOnEventID(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if _, err := outbox.Enqueue(ctx, pool, ev("e1", "A", 1)); err != nil {
		t.Fatal(err)
	}
	// The same event again (a retry: its occurrence time and trace id may
	// differ, they were filled in), next to a new one and a repeat within
	// the call.
	again := ev("e1", "A", 1)
	again.OccurredAt = time.Now().Add(time.Minute)
	res, err := outbox.Enqueue(ctx, pool, again, ev("e2", "A", 2), ev("e2", "A", 2))
	if err != nil {
		t.Fatal(err)
	}
	if !res[0].Duplicate || res[1].Duplicate || res[0].State != outbox.StatePending {
		t.Fatalf("%+v", res)
	}
	if n := count(t, pool); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
}

// A repeated id is a duplicate only when it repeats the same event: under
// any other topic, aggregate, version, event type or payload it is
// refused with ErrEventIDConflict, the error says nothing of the stored
// event, and nothing of the call is written, the new events beside it
// included. (Before, such an id answered "duplicate" with the stored
// event's topic and aggregate, and the caller's event was silently lost.)
func TestEnqueueRefusesAnIDTakenByAnotherEvent(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	stored := ev("taken", "order-42", 1)
	stored.Topic, stored.AggregateType, stored.Type = "member.points.events", "points", "points.added"
	if _, err := outbox.Enqueue(ctx, pool, stored); err != nil {
		t.Fatal(err)
	}
	same := func(e *event.Event) {
		e.Topic, e.AggregateType, e.Type = stored.Topic, stored.AggregateType, stored.Type
	}
	for name, change := range map[string]func(*event.Event){
		"topic":          func(e *event.Event) { same(e); e.Topic = "shop.order.events" },
		"aggregate type": func(e *event.Event) { same(e); e.AggregateType = "member" },
		"aggregate id":   func(e *event.Event) { same(e); e.AggregateID = "order-43" },
		"version":        func(e *event.Event) { same(e); e.Version = 2 },
		"event type":     func(e *event.Event) { same(e); e.Type = "order.purchased" },
		"payload":        func(e *event.Event) { same(e); e.Payload = []byte(`{"n":2}`) },
	} {
		e := ev("taken", "order-42", 1)
		change(e)
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = outbox.Enqueue(ctx, tx, ev("fresh", "B", 1), e)
		_ = tx.Commit(ctx)
		if !errors.Is(err, outbox.ErrEventIDConflict) {
			t.Errorf("%s differs: %v, want ErrEventIDConflict", name, err)
			continue
		}
		if strings.Contains(err.Error(), "member.points.events") || strings.Contains(err.Error(), "points.added") {
			t.Errorf("%s differs: the error reveals the stored event: %v", name, err)
		}
		if n := count(t, pool); n != 1 {
			t.Fatalf("%s differs: %d rows, want 1 (nothing of the call written, the new event beside it included)", name, n)
		}
	}
	// The same event is still a duplicate.
	e := ev("taken", "order-42", 1)
	same(e)
	if res, err := outbox.Enqueue(ctx, pool, e); err != nil || !res[0].Duplicate {
		t.Fatalf("the stored event repeated: %+v, %v", res, err)
	}
}
func TestEnqueueRefusesAVersionTakenByAnotherEvent(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if _, err := outbox.Enqueue(ctx, pool, ev("e1", "A", 1)); err != nil {
		t.Fatal(err)
	}
	_, err := outbox.Enqueue(ctx, pool, ev("other", "A", 1))
	if !errors.Is(err, outbox.ErrVersionConflict) {
		t.Fatalf("got %v", err)
	}
}

func TestEnqueueValidates(t *testing.T) {
	bad := ev("e1", "bad id", 0)
	_, err := outbox.Enqueue(context.Background(), newDB(t), bad)
	fes := event.FieldErrors(err)
	if len(fes) != 2 || fes[0].Field != "aggregateId" || fes[1].Field != "version" {
		t.Fatalf("got %v", err)
	}
}

func TestRepush(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	e := ev("e1", "A", 1)
	if _, err := outbox.Enqueue(ctx, pool, e); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Repush(ctx, pool, ev("e1", "A", 1), ""); !errors.Is(err, outbox.ErrPending) {
		t.Fatalf("re-push of a pending row: %v", err)
	}
	// Published (the relay moved the cursor over it): the re-push is queued,
	// addressed to the consumer, and the event is pending until it goes out.
	_, _ = pool.Exec(ctx, `UPDATE relaybus_outbox_dispatch SET published_version = 1, due_at = NULL`)
	if st, _ := outbox.Lookup(ctx, pool, "e1"); st["e1"].State != outbox.StatePublished {
		t.Fatalf("before re-push: %+v", st["e1"])
	}
	if _, err := outbox.Repush(ctx, pool, ev("e1", "A", 1), "message-service"); err != nil {
		t.Fatal(err)
	}
	st, _ := outbox.Lookup(ctx, pool, "e1")
	if st["e1"].State != outbox.StatePending || st["e1"].Target != "message-service" {
		t.Fatalf("after re-push: %+v", st["e1"])
	}
	if _, err := outbox.Repush(ctx, pool, ev("e1", "A", 1), ""); !errors.Is(err, outbox.ErrPending) {
		t.Fatalf("second re-push while the first is queued: %v", err)
	}
	if c, _ := outbox.Count(ctx, pool); c.Repushes != 1 || c.Pending != 1 {
		t.Fatalf("backlog %+v, want the re-push pending", c)
	}
	// Retention deleted the row: re-push inserts it again (as published) and
	// queues it.
	_, _ = pool.Exec(ctx, `DELETE FROM relaybus_outbox_repush`)
	_, _ = pool.Exec(ctx, `DELETE FROM relaybus_outbox`)
	_, _ = pool.Exec(ctx, `DELETE FROM relaybus_outbox_dispatch`)
	if _, err := outbox.Repush(ctx, pool, ev("e1", "A", 1), ""); err != nil || count(t, pool) != 1 {
		t.Fatalf("re-push after retention: %v", err)
	}
	if st, _ := outbox.Lookup(ctx, pool, "e1"); st["e1"].State != outbox.StatePending {
		t.Fatalf("re-pushed after retention: %+v", st["e1"])
	}
	// Back in as published: the re-push sends it, the aggregate's run does
	// not (the outbox's insert trigger leaves it alone).
	var published int64
	var due bool
	if err := pool.QueryRow(ctx, `SELECT published_version, due_at IS NOT NULL FROM relaybus_outbox_dispatch`).Scan(&published, &due); err != nil || published != 1 || due {
		t.Fatalf("re-pushed after retention: dispatch published %d, due %v (%v); want 1, not due", published, due, err)
	}
	// The trigger is off for that one insert only: the next one is due.
	if _, err := outbox.Enqueue(ctx, pool, ev("e2", "A", 2)); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT due_at IS NOT NULL FROM relaybus_outbox_dispatch`).Scan(&due); err != nil || !due {
		t.Fatalf("enqueued after the re-push: due %v (%v)", due, err)
	}
}

func TestRepushOfAFailedVersionUnblocksItsAggregate(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if _, err := outbox.Enqueue(ctx, pool, ev("e1", "A", 1), ev("e2", "A", 2)); err != nil {
		t.Fatal(err)
	}
	_, _ = pool.Exec(ctx, `UPDATE relaybus_outbox_dispatch SET failed_version = 1, failed_at = now(), attempts = 5,
		last_error = 'permission denied', due_at = NULL`)
	st, _ := outbox.Lookup(ctx, pool, "e1", "e2")
	if st["e1"].State != outbox.StateFailed || st["e1"].Attempts != 5 || st["e2"].State != outbox.StatePending {
		t.Fatalf("failed: %+v", st)
	}
	if c, _ := outbox.Count(ctx, pool); c.Failed != 1 || c.Blocked != 1 || c.Pending != 0 {
		t.Fatalf("backlog %+v", c)
	}
	if _, err := outbox.Repush(ctx, pool, ev("e2", "A", 2), ""); !errors.Is(err, outbox.ErrPending) {
		t.Fatalf("re-push of the version behind the failure: %v", err)
	}
	if _, err := outbox.Repush(ctx, pool, ev("e1", "A", 1), ""); err != nil {
		t.Fatal(err)
	}
	st, _ = outbox.Lookup(ctx, pool, "e1")
	if st["e1"].State != outbox.StatePending || st["e1"].Attempts != 0 {
		t.Fatalf("after re-push: %+v", st["e1"])
	}
	runs, err := outbox.Claim(ctx, pool, outbox.ClaimOptions{Owner: "r", Lease: time.Minute, Aggregates: 10, RunLimit: 10, Limit: 10})
	if err != nil || len(runs) != 1 || len(runs[0].Rows) != 2 {
		t.Fatalf("claim after re-push: %+v %v", runs, err)
	}
}
