package publish_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// With the relay's fast path, an accepted event is on Pub/Sub when the
// answer comes: 202 with status published; a later version waits behind an
// earlier one that is still pending, and the answer says pending.
func TestFastPathPublishesAtOnceAndKeepsOrder(t *testing.T) {
	var fake *pubsubtest.Fake
	h := newHarness(t, func(o *publish.Options) {
		fake = pubsubtest.New(t)
		fake.Provision(t, loadTopology(t))
		r, err := relay.New(relay.Options{DB: o.DB.(*pgxpool.Pool), Publisher: fake.Client, Topology: loadTopology(t)})
		if err != nil {
			t.Fatal(err)
		}
		o.FastPath = r
	})
	send := func(id string, version int) publish.Result {
		env := envelope(map[string]any{"eventId": id, "aggregateId": "order-7", "version": version})
		status, body, _ := post(t, h.url, mustJSON(t, env), "Content-Type", "application/json")
		if status != http.StatusAccepted {
			t.Fatalf("%s: status %d: %s", id, status, body)
		}
		return decodeJSON[publish.Result](t, body)
	}
	if res := send("evt-v1", 1); res.Status != publish.StatusPublished {
		t.Fatalf("v1: %+v, want published at once", res)
	}
	if n := len(fake.Server.Messages()); n != 1 {
		t.Fatalf("Pub/Sub holds %d messages after the 202, want 1", n)
	}
	// Another relay holds order-8's v1: its v2 must wait behind it.
	ctx := context.Background()
	if _, err := outbox.Enqueue(ctx, h.pool, &event.Event{ID: "evt-8-v1", Type: "order.purchased", Source: "order-service",
		Topic: "shop.order.events", AggregateID: "order-8", Version: 1, Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Claim(ctx, h.pool, outbox.ClaimOptions{Owner: "other-relay", Lease: time.Minute, Limit: 10,
		Aggregates: 1, RunLimit: 10, Events: []string{"evt-8-v1"}}); err != nil {
		t.Fatal(err)
	}
	env := envelope(map[string]any{"eventId": "evt-8-v2", "aggregateId": "order-8", "version": 2})
	status, body, _ := post(t, h.url, mustJSON(t, env), "Content-Type", "application/json")
	if res := decodeJSON[publish.Result](t, body); status != http.StatusAccepted || res.Status != publish.StatusPending {
		t.Errorf("v2 behind a v1 another relay holds: %d %+v, want 202 pending", status, res)
	}
	if n := len(fake.Server.Messages()); n != 1 {
		t.Errorf("Pub/Sub holds %d messages, want only order-7's", n)
	}
	if res := send("evt-v2", 2); res.Status != publish.StatusPublished {
		t.Errorf("order-7 v2: %+v, want published", res)
	}
}

// hangingFastPath never answers until its context ends, as a Pub/Sub that
// does not answer would.
type hangingFastPath struct{ started chan struct{} }

func (f hangingFastPath) PublishNow(ctx context.Context, ids ...string) (map[string]outbox.State, error) {
	select {
	case f.started <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

// Whatever Pub/Sub does, the request takes no longer than its budget: the
// event is committed, and the answer says it is left to the relay.
func TestBudgetBoundsTheRequest(t *testing.T) {
	h := newHarness(t, func(o *publish.Options) {
		o.FastPath = hangingFastPath{started: make(chan struct{}, 1)}
		o.Budget = 300 * time.Millisecond
	})
	start := time.Now()
	env := envelope(map[string]any{"eventId": "evt-slow", "aggregateId": "order-9", "version": 1})
	status, body, _ := post(t, h.url, mustJSON(t, env), "Content-Type", "application/json")
	took := time.Since(start)
	if res := decodeJSON[publish.Result](t, body); status != http.StatusAccepted || res.Status != publish.StatusPending {
		t.Fatalf("answer %d %+v, want 202 pending", status, res)
	}
	if took > 2*time.Second {
		t.Errorf("the request took %v with a 300ms budget", took)
	}
	if st, _ := outbox.Lookup(context.Background(), h.pool, "evt-slow"); st["evt-slow"].State != outbox.StatePending {
		t.Errorf("the event is not in the outbox: %+v", st)
	}
}

// A publish that cannot be taken (every slot busy) answers 503 with
// Retry-After at once instead of waiting.
func TestBusyAnswers503WithRetryAfter(t *testing.T) {
	started := make(chan struct{}, 1)
	h := newHarness(t, func(o *publish.Options) {
		o.FastPath = hangingFastPath{started: started}
		o.Budget = 3 * time.Second
		o.MaxInFlight = 1
	})
	go func() {
		env := envelope(map[string]any{"eventId": "evt-holds-the-slot", "aggregateId": "order-10", "version": 1})
		post(t, h.url, mustJSON(t, env), "Content-Type", "application/json")
	}()
	<-started
	start := time.Now()
	env := envelope(map[string]any{"eventId": "evt-turned-away", "aggregateId": "order-11", "version": 1})
	status, body, hdr := post(t, h.url, mustJSON(t, env), "Content-Type", "application/json")
	if status != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" || decodeJSON[publish.ErrorResponse](t, body).Error != publish.CodeBusy {
		t.Fatalf("second request: %d %s (Retry-After %q), want 503 busy with Retry-After", status, body, hdr.Get("Retry-After"))
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("the refusal took %v", took)
	}
	if st, _ := outbox.Lookup(context.Background(), h.pool, "evt-turned-away"); len(st) != 0 {
		t.Errorf("a refused event was written: %+v", st)
	}
}

// With the relay as its fast path (the outbox write and the lease in one
// statement), publish keeps its answers: a repeat of the same event is a
// duplicate that writes and publishes nothing more, another event under a
// taken eventId is 409 and writes nothing of its batch, and a Postgres that
// is gone is 503 with Retry-After.
func TestFastPathKeepsTheOutboxGuarantees(t *testing.T) {
	var (
		fake *pubsubtest.Fake
		pool *pgxpool.Pool
	)
	h := newHarness(t, func(o *publish.Options) {
		fake = pubsubtest.New(t)
		fake.Provision(t, loadTopology(t))
		pool = o.DB.(*pgxpool.Pool)
		r, err := relay.New(relay.Options{DB: pool, Publisher: fake.Client, Topology: loadTopology(t)})
		if err != nil {
			t.Fatal(err)
		}
		o.FastPath = r
	})
	env := envelope(map[string]any{"eventId": "evt-dup", "aggregateId": "order-9", "version": 1})
	for i, want := range []bool{false, true} {
		status, body, _ := post(t, h.url, mustJSON(t, env), "Content-Type", "application/json")
		res := decodeJSON[publish.Result](t, body)
		if status != http.StatusAccepted || res.Status != publish.StatusPublished || res.Duplicate != want {
			t.Fatalf("request %d: %d %+v, want 202 published, duplicate %v", i, status, res, want)
		}
	}
	if n := len(fake.Server.Messages()); n != 1 {
		t.Fatalf("Pub/Sub holds %d messages after the event and its repeat, want 1", n)
	}

	clash := envelope(map[string]any{"eventId": "evt-dup", "aggregateId": "order-9", "version": 1, "payload": map[string]any{"other": true}})
	batch := []map[string]any{envelope(map[string]any{"eventId": "evt-beside", "aggregateId": "order-10", "version": 1}), clash}
	status, body, _ := post(t, h.url, mustJSON(t, batch), "Content-Type", "application/json")
	if e := decodeJSON[publish.ErrorResponse](t, body); status != http.StatusConflict || e.Error != publish.CodeEventIDConflict {
		t.Fatalf("another event under a taken eventId: %d %s, want 409 %s", status, body, publish.CodeEventIDConflict)
	}
	if n := h.rows(t); n != 1 {
		t.Fatalf("%d rows after the refused batch, want 1: the event beside the clash was written", n)
	}

	pool.Close() // Postgres is gone
	status, body, hdr := post(t, h.url, mustJSON(t, envelope(nil)), "Content-Type", "application/json")
	if e := decodeJSON[publish.ErrorResponse](t, body); status != http.StatusServiceUnavailable || e.Error != publish.CodeUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("Postgres gone: %d %s (Retry-After %q), want 503 %s with Retry-After", status, body, hdr.Get("Retry-After"), publish.CodeUnavailable)
	}
}
