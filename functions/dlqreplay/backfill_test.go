package dlqreplay_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

// published enqueues versions 1..n of each aggregate into the env's outbox
// and publishes them with a real relay; the first half of the aggregates'
// rows are then moved to the history, as retention does.
func published(t *testing.T, e *env, n int64, aggs ...string) {
	t.Helper()
	ctx := context.Background()
	for _, a := range aggs {
		var evs []*event.Event
		for v := int64(1); v <= n; v++ {
			evs = append(evs, &event.Event{ID: fmt.Sprintf("%s-v%d", a, v), Type: "order.purchased", Source: "order-service",
				Topic: "shop.order.events", AggregateID: a, Version: v, Payload: []byte(`{}`)})
		}
		if _, err := outbox.Enqueue(ctx, e.db, evs...); err != nil {
			t.Fatal(err)
		}
	}
	drainOutbox(t, e.db, e.fake.Client, e.top)
	if _, err := outbox.PurgeWith(ctx, e.db, outbox.PurgeOptions{Before: time.Now().Add(time.Minute), Limit: int(n) * len(aggs) / 2,
		History: outbox.History{Default: time.Hour}}); err != nil {
		t.Fatal(err)
	}
}

// queuedFor lists the event ids queued as re-pushes to consumer, in order.
func queuedFor(t *testing.T, e *env, consumer string) []string {
	t.Helper()
	rows, err := e.db.Query(context.Background(), `SELECT event_id FROM relaybus_outbox_repush WHERE target_consumer = $1 ORDER BY id`, consumer)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out = append(out, id)
	}
	return out
}

// A backfill over the API: bad fields named with their rule, a dry run
// that counts, then created, paused (a :run then queues nothing), resumed
// and run to the end: every event of its scope queued once, to its
// consumer alone, in aggregate and version order; each action audited.
func TestBackfillAPI(t *testing.T) {
	e := newEnv(t, dlqreplay.AuthNone, "")
	published(t, e, 4, "o-1", "o-2", "o-3")
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)

	a := e.do(t, "POST", "/backfills", map[string]any{"topic": "shop.order.events", "consumer": "nobody-service", "rate": 0,
		"aggregates": []string{"bad id"}, "database": "nowhere"})
	if f := a.fields(); a.status != 400 || !slices.Equal(f, []string{"consumer", "since", "aggregates", "rate", "database"}) {
		t.Fatalf("bad request: %d %v %s", a.status, f, a.raw)
	}

	req := map[string]any{"topic": "shop.order.events", "consumer": "member-service", "since": since,
		"aggregates": []string{"o-1", "o-3"}, "rate": 1000}
	dry := e.do(t, "POST", "/backfills", merge(req, map[string]any{"dryRun": true}))
	if dry.status != 200 || dry.body["matched"] != float64(8) {
		t.Fatalf("dry run: %s", dry.raw)
	}
	if n := len(queuedFor(t, e, "member-service")); n != 0 {
		t.Fatalf("the dry run queued %d", n)
	}
	c := e.do(t, "POST", "/backfills", req)
	if c.status != 200 || c.body["state"] != "running" || c.body["matched"] != float64(8) {
		t.Fatalf("create: %s", c.raw)
	}
	id := c.body["id"].(string)

	if a := e.do(t, "POST", "/backfills/"+id+":pause", nil); a.status != 200 || a.body["state"] != "paused" {
		t.Fatalf("pause: %s", a.raw)
	}
	if a := e.do(t, "POST", "/backfills/"+id+":pause", nil); a.status != 409 {
		t.Fatalf("pause a paused backfill: %d %s", a.status, a.raw)
	}
	if a := e.do(t, "POST", "/backfills/"+id+":run", map[string]any{"seconds": 1}); a.status != 200 || a.body["queued"] != float64(0) {
		t.Fatalf("run while paused: %s", a.raw)
	}
	if a := e.do(t, "POST", "/backfills/"+id+":resume", nil); a.status != 200 || a.body["state"] != "running" {
		t.Fatalf("resume: %s", a.raw)
	}
	if a := e.do(t, "POST", "/backfills/"+id+":run", nil); a.status != 200 || a.body["state"] != "done" || a.body["queued"] != float64(8) {
		t.Fatalf("run: %s", a.raw)
	}
	want := []string{"o-1-v1", "o-1-v2", "o-1-v3", "o-1-v4", "o-3-v1", "o-3-v2", "o-3-v3", "o-3-v4"}
	if got := queuedFor(t, e, "member-service"); !slices.Equal(got, want) {
		t.Fatalf("queued %v, want %v", got, want)
	}
	if a := e.do(t, "GET", "/backfills/"+id, nil); a.status != 200 || a.body["state"] != "done" || a.body["remaining"] != float64(0) {
		t.Fatalf("get: %s", a.raw)
	}
	if a := e.do(t, "GET", "/backfills", nil); a.status != 200 || len(a.body["backfills"].([]any)) != 1 {
		t.Fatalf("list: %s", a.raw)
	}
	if a := e.do(t, "POST", "/backfills/"+id+":cancel", nil); a.status != 409 {
		t.Fatalf("cancel a done backfill: %d %s", a.status, a.raw)
	}
	if a := e.do(t, "GET", "/backfills/bf-none", nil); a.status != 404 {
		t.Fatalf("unknown id: %d %s", a.status, a.raw)
	}

	entries, err := e.store.Audit().List(context.Background(), audit.Query{ActionPrefix: "backfill.", Limit: 50})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, en := range entries {
		if en.Action == audit.Backfill || en.Action == audit.BackfillControl {
			actions = append(actions, en.Action+" "+en.Outcome)
		}
	}
	sort.Strings(actions)
	if len(actions) < 6 {
		t.Errorf("audit has %v; want the create and each pause/resume, started and ended", actions)
	}
}

func merge(a, b map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}
