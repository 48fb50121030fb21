package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

// historyIDs lists the history's event ids, by aggregate and version.
func historyIDs(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id FROM relaybus_outbox_history ORDER BY aggregateid, version`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// Retention moves published rows of a topic that keeps history into the
// history, kept for the topic's retention; a cancelled row is not history.
// The relay's re-push claim finds a row there. Once the partition's month
// is over, PruneHistory drops it.
func TestPurgeMovesPublishedRowsToHistory(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if _, err := outbox.Enqueue(ctx, pool, ev("a1", "A", 1), ev("a2", "A", 2), ev("b1", "B", 1),
		at(ev("c1", "C", 1), time.Now().Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Cancel(ctx, pool, "c1", outbox.CancelOptions{}); err != nil {
		t.Fatal(err)
	}
	settleAll(t, pool, time.Now(), claim(t, pool, time.Now(), "r1"))

	keep := 48 * time.Hour
	n, err := outbox.PurgeWith(ctx, pool, outbox.PurgeOptions{Before: time.Now().Add(time.Minute), Limit: 100,
		History: outbox.History{Topics: map[string]time.Duration{"shop.order.events": keep}}})
	if err != nil || n != 4 {
		t.Fatalf("purge took %d rows (%v), want 4", n, err)
	}
	if c := count(t, pool); c != 0 {
		t.Fatalf("%d rows left in the outbox", c)
	}
	if got := historyIDs(t, pool); len(got) != 3 || got[0] != "a1" || got[1] != "a2" || got[2] != "b1" {
		t.Fatalf("history = %v, want [a1 a2 b1] (the cancelled c1 is not history)", got)
	}
	var left float64
	if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM min(keep_until) - now()) FROM relaybus_outbox_history`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left < (keep-time.Minute).Seconds() || left > keep.Seconds() {
		t.Fatalf("kept for %.0f s more, want about %.0f", left, keep.Seconds())
	}

	// A re-push of a history row (what a backfill queues) is claimed with its event.
	if _, err := pool.Exec(ctx, `INSERT INTO relaybus_outbox_repush (event_id, target_consumer) VALUES ('a2', 'new-service')`); err != nil {
		t.Fatal(err)
	}
	qs, err := outbox.ClaimRepushes(ctx, pool, time.Now(), time.Minute, 10)
	if err != nil || len(qs) != 1 || !qs[0].Found || qs[0].Row.Event.ID != "a2" || qs[0].Row.Event.Version != 2 ||
		qs[0].Row.Target != "new-service" || string(qs[0].Row.Event.Payload) != `{"n":1}` {
		t.Fatalf("claimed %+v (%v), want a2 found in the history, addressed to new-service", qs, err)
	}

	// Not before the partition's month is over; then the whole month goes.
	if dropped, err := outbox.PruneHistory(ctx, pool, time.Now()); err != nil || len(dropped) != 0 {
		t.Fatalf("prune now dropped %v (%v), want nothing", dropped, err)
	}
	dropped, err := outbox.PruneHistory(ctx, pool, time.Now().Add(keep).AddDate(0, 1, 1))
	if err != nil || len(dropped) == 0 || len(historyIDs(t, pool)) != 0 {
		t.Fatalf("prune after the month dropped %v (%v), history %v left", dropped, err, historyIDs(t, pool))
	}
}

// A topic with no history retention (the zero History, or 0 for the
// topic) loses its rows to retention as before.
func TestPurgeWithoutHistoryDeletes(t *testing.T) {
	ctx := context.Background()
	for _, h := range []outbox.History{{}, {Topics: map[string]time.Duration{"shop.order.events": 0}, Default: time.Hour}} {
		pool := newDB(t)
		if _, err := outbox.Enqueue(ctx, pool, ev("a1", "A", 1)); err != nil {
			t.Fatal(err)
		}
		settleAll(t, pool, time.Now(), claim(t, pool, time.Now(), "r1"))
		n, err := outbox.PurgeWith(ctx, pool, outbox.PurgeOptions{Before: time.Now().Add(time.Minute), Limit: 100, History: h})
		if err != nil || n != 1 || len(historyIDs(t, pool)) != 0 {
			t.Fatalf("history %+v: purge took %d (%v), history %v; want 1 deleted, none kept", h, n, err, historyIDs(t, pool))
		}
	}
}

// Relays run retention at once: those that race to create the same
// partitions all succeed.
func TestHistoryPartitionsCreatedConcurrently(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	errs := make(chan error, 8)
	for range 8 {
		go func() { errs <- outbox.EnsureHistoryPartitions(ctx, pool, time.Now(), 400*24*time.Hour) }()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent partition creation: %v", err)
		}
	}
}

// Erasing a subject reaches the history as well as the outbox: the
// subject's payloads become JSON null in both (a backfill then delivers
// the null), the other subject's rows are untouched, and a second erasure
// changes nothing.
func TestEraseSubjectReachesTheHistory(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	mk := func(id, agg string, v int64, customer string) *event.Event {
		e := ev(id, agg, v)
		e.Payload = []byte(`{"customer":{"id":"` + customer + `"},"email":"` + customer + `@example.com"}`)
		return e
	}
	if _, err := outbox.Enqueue(ctx, pool, mk("a1", "A", 1, "c-1"), mk("b1", "B", 1, "c-2")); err != nil {
		t.Fatal(err)
	}
	settleAll(t, pool, time.Now(), claim(t, pool, time.Now(), "r1"))
	if _, err := outbox.PurgeWith(ctx, pool, outbox.PurgeOptions{Before: time.Now().Add(time.Minute), Limit: 100,
		History: outbox.History{Topics: map[string]time.Duration{"shop.order.events": 48 * time.Hour}}}); err != nil {
		t.Fatal(err)
	}
	// One more of c-1's events, still in the outbox.
	if _, err := outbox.Enqueue(ctx, pool, mk("a2", "A", 2, "c-1")); err != nil {
		t.Fatal(err)
	}
	n, err := outbox.EraseSubject(ctx, pool, "shop.order.events", []string{"customer", "id"}, "c-1")
	if err != nil || n != 2 {
		t.Fatalf("erase changed %d rows (%v), want c-1's two: one in the history, one in the outbox", n, err)
	}
	var plain int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT payload FROM relaybus_outbox UNION ALL SELECT payload FROM relaybus_outbox_history) p
		WHERE position(convert_to('c-1', 'UTF8') in payload) > 0`).Scan(&plain); err != nil || plain != 0 {
		t.Errorf("%d payloads still name c-1 (%v), want none", plain, err)
	}
	var other string
	if err := pool.QueryRow(ctx, `SELECT convert_from(payload, 'UTF8') FROM relaybus_outbox_history WHERE id = 'b1'`).Scan(&other); err != nil || !strings.Contains(other, "c-2@example.com") {
		t.Errorf("c-2's history row: %q (%v), want it whole", other, err)
	}
	if n, err := outbox.EraseSubject(ctx, pool, "shop.order.events", []string{"customer", "id"}, "c-1"); err != nil || n != 0 {
		t.Errorf("a second erasure changed %d rows (%v), want none", n, err)
	}
}

// History.Keep rewrites the payloads of its topics as they move into the
// history, in the purge's transaction; another topic keeps its payloads as
// produced. When the rewrite fails, the purge fails whole: the rows stay
// in the outbox and the history holds none of them.
func TestPurgeRewritesTheKeptPayloads(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	other := ev("p1", "P", 1)
	other.Topic = "shop.payment.events"
	if _, err := outbox.Enqueue(ctx, pool, ev("a1", "A", 1), ev("a2", "A", 2), other); err != nil {
		t.Fatal(err)
	}
	settleAll(t, pool, time.Now(), claim(t, pool, time.Now(), "r1"))
	hist := outbox.History{Default: 48 * time.Hour}
	purge := func(keep func([]byte) ([]byte, error)) (int, error) {
		hist.Keep = map[string]func([]byte) ([]byte, error){"shop.order.events": keep}
		return outbox.PurgeWith(ctx, pool, outbox.PurgeOptions{Before: time.Now().Add(time.Minute), Limit: 100, History: hist})
	}

	if n, err := purge(func([]byte) ([]byte, error) { return nil, errors.New("no key") }); err == nil || n != 0 {
		t.Fatalf("purge with a failing rewrite took %d rows (%v), want an error", n, err)
	}
	if c, h := count(t, pool), historyIDs(t, pool); c != 3 || len(h) != 0 {
		t.Fatalf("after a failed rewrite: %d outbox rows, history %v; want 3 and none", c, h)
	}

	if n, err := purge(func(p []byte) ([]byte, error) { return []byte(`{"n":"redacted"}`), nil }); err != nil || n != 3 {
		t.Fatalf("purge took %d rows (%v), want 3", n, err)
	}
	rows, err := pool.Query(ctx, `SELECT id, convert_from(payload, 'UTF8') FROM relaybus_outbox_history ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var id, p string
		if err := rows.Scan(&id, &p); err != nil {
			t.Fatal(err)
		}
		got[id] = p
	}
	rows.Close()
	want := map[string]string{"a1": `{"n":"redacted"}`, "a2": `{"n":"redacted"}`, "p1": `{"n":1}`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("history payloads %v, want %v", got, want)
	}
}
