package consume_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/examples/shop"
	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/fnproc"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/topology"
)

func TestMain(m *testing.M) {
	fnproc.Serve() // BenchmarkConsume and the kill tests run this binary again as the function
	pgtest.Main(m)
}

const (
	topic = "shop.order.events"
	sub   = "shop.order.events.member-service-processor"
)

// memLedger is the ledger as consume sees it, in memory: it keeps the
// attempts shipped to it; fail makes the next n writes fail. (The ledger
// itself is tested on the Firestore emulator in internal/ledger and in the
// tests below that say so.)
type memLedger struct {
	mu       sync.Mutex
	attempts []model.Attempt
	fail     int
}

func (l *memLedger) RecordAttempts(_ context.Context, as []model.Attempt) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail > 0 {
		l.fail--
		return errors.New("firestore unavailable")
	}
	l.attempts = append(l.attempts, as...)
	return nil
}

func (l *memLedger) all() []model.Attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]model.Attempt(nil), l.attempts...)
}

type stack struct {
	pool   *pgxpool.Pool
	fake   *pubsubtest.Fake
	ledger *memLedger
	engine *consumer.Engine
	url    string
}

// shipped waits until the engine's background shipper has tried every
// attempt so far, and returns what the ledger holds.
func (s *stack) shipped(t testing.TB) []model.Attempt {
	t.Helper()
	if err := s.engine.FlushLedger(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s.ledger.all()
}

func newStack(t testing.TB, h consumer.Handler, consumerID string) *stack {
	t.Helper()
	return newStackOn(t, pgtest.Schema(t), h, consumerID)
}

func newStackOn(t testing.TB, pool *pgxpool.Pool, h consumer.Handler, consumerID string) *stack {
	t.Helper()
	return newStackWith(t, pool, h, consumerID, nil)
}

// newStackWith is newStack on pool with the engine's options adjusted.
func newStackWith(t testing.TB, pool *pgxpool.Pool, h consumer.Handler, consumerID string, adjust func(*consumer.Options)) *stack {
	t.Helper()
	ctx := context.Background()
	if err := consume.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if m, ok := h.(consume.Migrator); ok {
		if err := m.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	fake := pubsubtest.New(t)
	top, _ := topology.Load("")
	fake.Provision(t, top)
	led := &memLedger{}
	o := consumer.Options{DB: pool, ConsumerID: consumerID, Subscription: sub, Handler: h,
		DeadLetters: fake.Client, Ledger: led, MaxDeliveryAttempts: 5}
	if adjust != nil {
		adjust(&o)
	}
	engine, err := consumer.New(o)
	if err != nil {
		t.Fatal(err)
	}
	hh, err := consume.New(consume.Options{Engine: engine, DB: pool})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/consume/"+sub+"/", http.StripPrefix("/consume/"+sub, hh))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { _ = engine.Close(context.Background()) })
	return &stack{pool: pool, fake: fake, ledger: led, engine: engine, url: srv.URL + "/consume/" + sub + "/"}
}

func message(t testing.TB, e *event.Event) event.Message {
	t.Helper()
	if err := e.Prepare(time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC), event.Limits{}); err != nil {
		t.Fatal(err)
	}
	m, err := cloudevent.Encode(e, event.EncodingJSON)
	if err != nil {
		t.Fatal(err)
	}
	m.ID = "msg-" + e.ID
	return m
}

func orderEvent(agg string, version int64) *event.Event {
	return &event.Event{ID: fmt.Sprintf("%s-v%d", agg, version), Type: "order.purchased", Source: "order-service",
		Topic: topic, AggregateID: agg, Version: version,
		Payload: []byte(fmt.Sprintf(`{"orderId":%q,"memberId":"m-%s","amount":%d}`, agg, agg, version*10))}
}

type answer struct {
	code int
	res  consumer.Result
}

func (s *stack) push(t testing.TB, m event.Message, attempt int) answer {
	t.Helper()
	resp, err := http.Post(s.url, "application/json", bytes.NewReader(delivery.WrappedBody(m, "projects/p/subscriptions/"+sub, attempt)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a answer
	a.code = resp.StatusCode
	_ = json.NewDecoder(resp.Body).Decode(&a.res)
	return a
}

func (s *stack) do(t testing.TB, req *http.Request) answer {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a answer
	a.code = resp.StatusCode
	_ = json.NewDecoder(resp.Body).Decode(&a.res)
	return a
}

func (s *stack) count(t testing.TB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := s.pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestEveryRequestShapeDeliversTheSameEvent(t *testing.T) {
	s := newStack(t, projection.Latest(), "member-service")
	m := message(t, orderEvent("order-1", 1))
	eventarc, err := delivery.EventarcRequest(s.url, "p", topic, sub, m)
	if err != nil {
		t.Fatal(err)
	}
	unwrapped, err := delivery.UnwrappedRequest(s.url, sub, m, 2)
	if err != nil {
		t.Fatal(err)
	}
	first := s.push(t, m, 1)
	if first.code != 200 || first.res.Outcome != model.OutcomeSuccess || first.res.EventID != "order-1-v1" || first.res.Duplicate {
		t.Fatalf("wrapped push: %+v", first)
	}
	for name, req := range map[string]*http.Request{"eventarc": eventarc, "unwrapped push": unwrapped} {
		a := s.do(t, req)
		if a.code != 200 || !a.res.Duplicate || a.res.EventID != "order-1-v1" || a.res.Attempt != 1 {
			t.Errorf("%s: %+v, want the same event, a duplicate of attempt 1", name, a)
		}
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_inbox`); n != 1 {
		t.Errorf("%d inbox rows, want 1", n)
	}
	var state string
	_ = s.pool.QueryRow(context.Background(), `SELECT state->>'memberId' FROM relaybus_projection WHERE aggregate_id = 'order-1'`).Scan(&state)
	if state != "m-order-1" {
		t.Errorf("projection state memberId %q", state)
	}
	// The duplicates record nothing: one attempt, in Postgres and the ledger.
	if n := s.count(t, `SELECT count(*) FROM relaybus_attempts`); n != 1 {
		t.Errorf("%d attempts recorded, want 1", n)
	}
	got := s.shipped(t)
	if len(got) != 1 || got[0].AttemptNo != 1 || !got[0].Success || got[0].ConsumerID != "member-service" || got[0].Subscription == "" {
		t.Errorf("ledger attempts %+v", got)
	}
}

func TestPoisonIsAcknowledgedAndDeadLettered(t *testing.T) {
	mux := consumer.NewMux()
	mux.Register("order.purchased", "v1", projection.Latest())
	s := newStack(t, mux, "member-service")
	noAgg := message(t, orderEvent("order-2", 1))
	delete(noAgg.Attributes, "aggregate_id")
	noAgg.OrderingKey = ""
	noAgg.Data = bytes.Replace(noAgg.Data, []byte(`"subject":"order-2",`), nil, 1)
	v2 := orderEvent("order-3", 1)
	v2.SchemaVersion = "v9"
	cases := []struct {
		name, reason string
		m            event.Message
	}{
		{"malformed data", event.ReasonMalformed, event.Message{ID: "junk", Data: []byte("{not json"), Attributes: map[string]string{"content-type": "application/cloudevents+json", "event_id": "junk-1"}}},
		{"no aggregate id", event.ReasonMissingAggregateID, noAgg},
		{"unknown schema version", "no_handler", message(t, v2)},
	}
	for i, c := range cases {
		a := s.push(t, c.m, 1)
		if a.code != 200 || a.res.Outcome != model.OutcomePoison || a.res.Code != c.reason {
			t.Errorf("%s: %+v, want 200 poison %s", c.name, a, c.reason)
			continue
		}
		msgs := s.fake.Server.Messages()
		if len(msgs) != i+1 {
			t.Fatalf("%s: %d dead letters, want %d", c.name, len(msgs), i+1)
		}
		dl := msgs[i]
		info := deadletter.Read(event.Message{Attributes: dl.Attributes})
		if info.Reason != c.reason || info.Consumer != "member-service" || info.Error == "" || !bytes.Equal(dl.Data, c.m.Data) {
			t.Errorf("%s: dead letter %+v", c.name, info)
		}
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_inbox`); n != 0 {
		t.Errorf("poison left %d inbox rows", n)
	}
}

func TestConcurrentDuplicatesHaveOneEffect(t *testing.T) {
	var effects sync.Map
	h := consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		_, err := c.Tx.Exec(ctx, `INSERT INTO relaybus_projection (consumer_id, aggregate_type, aggregate_id, version, event_id, event_type, state)
			VALUES ($1, 'order', $2, 1, $3, 't', '{}')`, c.ConsumerID, c.Event.ID, c.Event.ID)
		effects.Store(c.Attempt, true)
		return err
	})
	s := newStack(t, h, "member-service")
	m := message(t, orderEvent("order-9", 1))
	var wg sync.WaitGroup
	codes := make([]int, 3)
	for i := range 3 {
		wg.Add(1)
		go func() { defer wg.Done(); codes[i] = s.push(t, m, 1).code }()
	}
	wg.Wait()
	s.push(t, m, 2)
	for i, c := range codes {
		if c != 200 {
			t.Errorf("delivery %d: %d", i, c)
		}
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_projection`); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_inbox`); n != 1 {
		t.Errorf("%d inbox rows, want 1", n)
	}
}

// deliverAsPubSub sends every message, concurrently and shuffled, and
// redelivers the ones answered non-2xx, shuffled again, as Pub/Sub does
// with a subscription's max delivery attempts: a message answered non-2xx
// at its maxAttempts-th delivery is dead-lettered (not redelivered) and
// counted. It returns the redeliveries and the dead-lettered messages.
func deliverAsPubSub(t *testing.T, s *stack, msgs []event.Message, maxAttempts int) (redeliveries int, deadLettered []event.Message) {
	t.Helper()
	pending := append([]event.Message(nil), msgs...)
	for attempt := 1; len(pending) > 0; attempt++ {
		rand.Shuffle(len(pending), func(i, j int) { pending[i], pending[j] = pending[j], pending[i] })
		var next []event.Message
		var mu sync.Mutex
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		for _, m := range pending {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if a := s.push(t, m, attempt); a.code != 200 {
					mu.Lock()
					if attempt == maxAttempts {
						deadLettered = append(deadLettered, m)
					} else {
						next = append(next, m)
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		redeliveries += len(next)
		pending = next
	}
	return redeliveries, deadLettered
}

func shuffledVersions(t *testing.T, aggregates, versions int) []event.Message {
	var msgs []event.Message
	for a := range aggregates {
		for v := 1; v <= versions; v++ {
			msgs = append(msgs, message(t, orderEvent(fmt.Sprintf("order-%03d", a), int64(v))))
		}
	}
	return msgs
}

func TestOutOfOrderDeliveryProjectionEndsAtNewest(t *testing.T) {
	const aggregates, versions = 100, 50
	s := newStack(t, projection.Latest(), "member-service")
	if _, dead := deliverAsPubSub(t, s, shuffledVersions(t, aggregates, versions), 3); len(dead) != 0 {
		t.Errorf("%d messages dead-lettered", len(dead))
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_projection WHERE version = $1 AND state->>'amount' = $2`, versions, fmt.Sprint(versions*10)); n != aggregates {
		t.Errorf("%d of %d aggregates at their newest state", n, aggregates)
	}
}

// appliedLog is a strict handler's next step that records, in the
// delivery's transaction, each version it applies; the log's order is the
// commit order of one aggregate's transactions (they hold its position
// lock until they commit).
func appliedLog(t testing.TB, pool *pgxpool.Pool) consumer.Handler {
	if _, err := pool.Exec(context.Background(), `CREATE TABLE strict_applied (
		aggregate_id text NOT NULL, version bigint NOT NULL, event_id text NOT NULL, seq bigserial PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		_, err := c.Tx.Exec(ctx, `INSERT INTO strict_applied (aggregate_id, version, event_id) VALUES ($1, $2, $3)`,
			c.Event.AggregateID, c.Event.Version, c.Event.ID)
		return err
	})
}

// appliedVersions returns each aggregate's applied versions in the order
// they were applied.
func appliedVersions(t testing.TB, s *stack) map[string][]int64 {
	rows, err := s.pool.Query(context.Background(), `SELECT aggregate_id, array_agg(version ORDER BY seq) FROM strict_applied GROUP BY aggregate_id`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]int64{}
	for rows.Next() {
		var agg string
		var vs []int64
		if err := rows.Scan(&agg, &vs); err != nil {
			t.Fatal(err)
		}
		out[agg] = vs
	}
	return out
}

// Versions 1..50 of 100 aggregates delivered shuffled and concurrently,
// each message at most 3 times (a 3rd refusal dead-letters it, as Pub/Sub
// does): the strict handler applies 1..50 in order for every aggregate and
// nothing is dead-lettered. Early versions are parked and acknowledged;
// each is applied, with a success attempt of its own, in the transaction
// that applied its predecessor, and the ledger ends with every event's
// latest attempt a success.
func TestOutOfOrderDeliveryStrictAppliesEveryVersionInOrder(t *testing.T) {
	const aggregates, versions = 100, 50
	pool := pgtest.Schema(t)
	s := newStackWith(t, pool, projection.Strict(appliedLog(t, pool)), "audit-service",
		func(o *consumer.Options) { o.MaxDeliveryAttempts = 3 })
	msgs := shuffledVersions(t, aggregates, versions)
	redeliveries, dead := deliverAsPubSub(t, s, msgs, 3)
	if len(dead) != 0 {
		t.Errorf("%d messages dead-lettered (%d redeliveries), want none", len(dead), redeliveries)
	}
	applied := appliedVersions(t, s)
	if len(applied) != aggregates {
		t.Errorf("%d aggregates applied, want %d", len(applied), aggregates)
	}
	for agg, vs := range applied {
		if len(vs) != versions {
			t.Errorf("%s applied %d versions, want %d: %v", agg, len(vs), versions, vs)
			continue
		}
		for i, v := range vs {
			if v != int64(i+1) {
				t.Fatalf("%s applied out of order: %v", agg, vs)
			}
		}
	}
	parked := s.count(t, `SELECT count(*) FROM relaybus_attempts WHERE outcome = 'parked'`)
	if parked == 0 {
		t.Fatal("no event was ever parked; the shuffle tested nothing")
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_strict_parked`); n != 0 {
		t.Errorf("%d events still parked", n)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_strict_position WHERE version = $1`, versions); n != aggregates {
		t.Errorf("%d aggregates at version %d, want %d", n, versions, aggregates)
	}
	// The ledger: every event's latest attempt succeeded; each succeeded
	// once; the parked ones were parked first.
	latest := map[string]model.Attempt{}
	successes := map[string]int{}
	parkedInLedger := 0
	for _, a := range s.shipped(t) {
		if cur, ok := latest[a.EventID]; !ok || a.AttemptNo > cur.AttemptNo {
			latest[a.EventID] = a
		}
		if a.Success {
			successes[a.EventID]++
		}
		if a.Outcome == model.OutcomeParked {
			parkedInLedger++
		}
	}
	if len(latest) != aggregates*versions {
		t.Errorf("the ledger has attempts for %d events, want %d", len(latest), aggregates*versions)
	}
	for id, a := range latest {
		if !a.Success || successes[id] != 1 {
			t.Errorf("%s: latest attempt %+v, %d successes; want one success, the latest", id, a, successes[id])
			break
		}
	}
	if parkedInLedger != parked {
		t.Errorf("the ledger has %d parked attempts, Postgres %d", parkedInLedger, parked)
	}
	t.Logf("%d of %d deliveries parked, %d redeliveries", parked, aggregates*versions, redeliveries)
}

func TestDatabaseDownThenRedeliveryAppliesOnce(t *testing.T) {
	ctx := context.Background()
	s := newStack(t, projection.Latest(), "member-service")
	down, err := pgxpool.New(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	engine, _ := consumer.New(consumer.Options{DB: down, ConsumerID: "member-service", Handler: projection.Latest(), DeadLetters: s.fake.Client})
	h, _ := consume.New(consume.Options{Engine: engine})
	srv := httptest.NewServer(h)
	defer srv.Close()
	m := message(t, orderEvent("order-5", 1))
	resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(delivery.WrappedBody(m, sub, 1)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("database down: %d, want 503", resp.StatusCode)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_inbox`); n != 0 {
		t.Fatalf("%d inbox rows", n)
	}
	if a := s.push(t, m, 2); a.code != 200 || a.res.Outcome != model.OutcomeSuccess {
		t.Fatalf("redelivery: %+v", a)
	}
	s.push(t, m, 3)
	if n := s.count(t, `SELECT count(*) FROM relaybus_projection`); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
}

// The ledger down after the commit changes nothing for the delivery: it is
// acknowledged at once (no redelivery, no second effect); the attempt waits
// in Postgres, and the scheduled shipping step records it once the ledger
// is back.
func TestLedgerDownAfterCommitIsShippedLater(t *testing.T) {
	s := newStack(t, projection.Latest(), "member-service")
	m := message(t, orderEvent("order-6", 1))
	s.ledger.fail = 1
	if a := s.push(t, m, 1); a.code != 200 || a.res.Outcome != model.OutcomeSuccess {
		t.Fatalf("ledger down after commit: %+v, want 200", a)
	}
	if got := s.shipped(t); len(got) != 0 {
		t.Fatalf("the ledger holds %+v though its write failed", got)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_inbox_unshipped q JOIN relaybus_attempts a USING (consumer_id, event_id, attempt_no) WHERE a.outcome = 'success'`); n != 1 {
		t.Fatalf("%d unshipped attempts in Postgres, want 1", n)
	}
	// Too recent for the scheduled step (the live shipper's turn): nothing.
	if rep, err := s.engine.Ship(context.Background(), 5*time.Second); err != nil || rep.Shipped != 0 {
		t.Fatalf("ship before the delay: %+v %v", rep, err)
	}
	_, _ = s.pool.Exec(context.Background(), `UPDATE relaybus_attempts SET consumed_at = consumed_at - interval '1 minute'`)
	resp, err := http.Post(s.url+"ledger:ship", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	var rep consumer.ShipReport
	_ = json.NewDecoder(resp.Body).Decode(&rep)
	resp.Body.Close()
	if resp.StatusCode != 200 || rep.Shipped != 1 {
		t.Fatalf("POST ledger:ship: %d %+v, want 1 shipped", resp.StatusCode, rep)
	}
	got := s.ledger.all()
	if len(got) != 1 || got[0].AttemptNo != 1 || !got[0].Success || got[0].EventID != "order-6-v1" {
		t.Errorf("ledger holds %+v, want attempt 1, success", got)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_inbox_unshipped`); n != 0 {
		t.Errorf("%d attempts still unshipped", n)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_projection WHERE aggregate_id = 'order-6'`); n != 1 {
		t.Errorf("%d effects, want 1", n)
	}
}

// Concurrent deliveries of one event while the ledger's write of the
// winner fails: the others are acknowledged as duplicates without recording
// anything, and the winner's attempt still reaches the ledger.
func TestConcurrentDuplicatesWhileTheLedgerFails(t *testing.T) {
	s := newStack(t, projection.Latest(), "member-service")
	s.ledger.fail = 1
	m := message(t, orderEvent("order-62", 1))
	var wg sync.WaitGroup
	answers := make([]answer, 4)
	for i := range answers {
		wg.Add(1)
		go func() { defer wg.Done(); answers[i] = s.push(t, m, 1) }()
	}
	wg.Wait()
	dups := 0
	for _, a := range answers {
		if a.code != 200 {
			t.Fatalf("a delivery answered %+v", a)
		}
		if a.res.Duplicate {
			dups++
		}
	}
	if dups != 3 {
		t.Fatalf("%d duplicates of 4, want 3", dups)
	}
	s.shipped(t)
	_, _ = s.pool.Exec(context.Background(), `UPDATE relaybus_attempts SET consumed_at = consumed_at - interval '1 minute'`)
	if rep, err := s.engine.Ship(context.Background(), 5*time.Second); err != nil || rep.Shipped != 1 {
		t.Fatalf("ship: %+v %v", rep, err)
	}
	if got := s.ledger.all(); len(got) != 1 || !got[0].Success {
		t.Errorf("ledger %+v, want the winner's attempt", got)
	}
}

func TestTransientFailuresAreRetriedThenDeadLetteredAtTheLastAttempt(t *testing.T) {
	h := consumer.HandlerFunc(func(context.Context, *consumer.Context) error {
		return errors.New("downstream unavailable")
	})
	s := newStack(t, h, "member-service")
	m := message(t, orderEvent("order-7", 1))
	for attempt := 1; attempt <= 5; attempt++ {
		a := s.push(t, m, attempt)
		want := model.OutcomeRetry
		if attempt == 5 {
			want = model.OutcomeDeadLettered
		}
		if a.code != http.StatusServiceUnavailable || a.res.Outcome != want || a.res.Attempt != attempt {
			t.Errorf("attempt %d: %+v, want 503 %s", attempt, a, want)
		}
	}
}

func TestPermanentErrorIsAcknowledgedAndRecorded(t *testing.T) {
	h := consumer.HandlerFunc(func(context.Context, *consumer.Context) error {
		return consumer.Permanent("insufficient_stock", errors.New("SKU-1 is sold out"))
	})
	s := newStack(t, h, "member-service")
	a := s.push(t, message(t, orderEvent("order-8", 1)), 1)
	if a.code != 200 || a.res.Outcome != model.OutcomeFailed || a.res.Code != "insufficient_stock" {
		t.Fatalf("%+v", a)
	}
	if got := s.shipped(t); len(got) != 1 || got[0].Success || got[0].ErrorCode != "insufficient_stock" {
		t.Errorf("ledger %+v", got)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_inbox`); n != 0 {
		t.Errorf("a permanent error left an inbox row")
	}
}

func TestTargetedMessageReachesOnlyItsConsumer(t *testing.T) {
	s := newStack(t, projection.Latest(), "member-service")
	m := message(t, orderEvent("order-10", 1))
	m.Attributes[topology.TargetConsumerAttr] = "message-service"
	if a := s.push(t, m, 1); a.code != 200 || !a.res.Ignored {
		t.Fatalf("%+v, want ignored", a)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_inbox`); n != 0 {
		t.Errorf("a message for another consumer was applied")
	}
}

func TestChildEventsShareTheTransaction(t *testing.T) {
	s := newStack(t, shop.Points(), "member-service")
	parent := orderEvent("order-11", 1)
	parent.TraceID, parent.CorrelationID = "4bf92f3577b34da6a3ce929d0e0e4736", "checkout-1"
	if a := s.push(t, message(t, parent), 1); a.code != 200 {
		t.Fatalf("%+v", a)
	}
	var typ, top, agg, parentID, trace, corr string
	var version int64
	if err := s.pool.QueryRow(context.Background(), `SELECT event_type, topic, aggregateid, version, parent_event_id, trace_id, correlation_id
		FROM relaybus_outbox`).Scan(&typ, &top, &agg, &version, &parentID, &trace, &corr); err != nil {
		t.Fatal(err)
	}
	if typ != "points.added" || top != "member.points.events" || agg != "m-order-11" || version != 1 ||
		parentID != parent.ID || trace != parent.TraceID || corr != "checkout-1" {
		t.Errorf("child %s %s %s v%d parent %s trace %s corr %s", typ, top, agg, version, parentID, trace, corr)
	}

	// A handler that emits and then fails leaves neither inbox row nor child.
	failing := consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		if err := c.Emit(ctx, &event.Event{Type: "points.added", Topic: "member.points.events", AggregateID: "m-x", Version: 1, Payload: []byte(`{}`)}); err != nil {
			return err
		}
		return errors.New("crash after emit")
	})
	s2 := newStack(t, failing, "member-service")
	if a := s2.push(t, message(t, orderEvent("order-12", 1)), 1); a.code != http.StatusServiceUnavailable {
		t.Fatalf("%+v", a)
	}
	if n := s2.count(t, `SELECT count(*) FROM relaybus_outbox`) + s2.count(t, `SELECT count(*) FROM relaybus_inbox`); n != 0 {
		t.Errorf("a rolled-back handler left %d rows", n)
	}
}

func TestNotifyFailsItsFirstAttemptWhenAsked(t *testing.T) {
	s := newStack(t, shop.Notify(), "message-service")
	e := orderEvent("order-13", 1)
	e.Payload = []byte(`{"orderId":"order-13","memberId":"m-1","amount":5,"failFirstNotify":true}`)
	m := message(t, e)
	if a := s.push(t, m, 1); a.code != http.StatusServiceUnavailable || a.res.Code != "demo_first_attempt" {
		t.Fatalf("first attempt: %+v", a)
	}
	if a := s.push(t, m, 2); a.code != 200 || a.res.Attempt != 2 {
		t.Fatalf("redelivery: %+v", a)
	}
}

// POST /inbox:purge deletes inbox rows and shipped attempts past the
// retention, and nothing newer.
func TestInboxPurgeDeletesOnlyRowsPastRetention(t *testing.T) {
	s := newStack(t, projection.Latest(), "member-service")
	for i := range 3 {
		if a := s.push(t, message(t, orderEvent(fmt.Sprintf("order-p%d", i), 1)), 1); a.code != 200 {
			t.Fatalf("%+v", a)
		}
	}
	s.shipped(t)
	ctx := context.Background()
	for _, q := range []string{
		`UPDATE relaybus_inbox SET processed_at = now() - interval '9 days' WHERE event_id = 'order-p0-v1'`,
		`UPDATE relaybus_attempts SET consumed_at = now() - interval '9 days' WHERE event_id IN ('order-p0-v1', 'order-p1-v1')`,
		// old but not in the ledger yet
		`INSERT INTO relaybus_inbox_unshipped SELECT consumer_id, event_id, attempt_no FROM relaybus_attempts WHERE event_id = 'order-p1-v1'`,
	} {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Post(s.url+"inbox:purge", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]int
	_ = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != 200 || body["purged"] != 2 {
		t.Fatalf("purge: %d %v, want 2 rows (one inbox row, its shipped attempt)", resp.StatusCode, body)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_inbox`); n != 2 {
		t.Errorf("%d inbox rows left, want 2", n)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_attempts WHERE event_id = 'order-p1-v1'`); n != 1 {
		t.Errorf("an old attempt the ledger does not have yet was purged")
	}
}

// A child event the database cannot take right now (here: its transaction
// is broken) asks for a redelivery; a child that is itself wrong is a
// permanent error.
func TestEmitFailuresAreClassifiedByCause(t *testing.T) {
	broken := consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		_, _ = c.Tx.Exec(ctx, `SELECT 1/0`) // aborts the transaction, as a dropped connection would fail it
		return c.Emit(ctx, &event.Event{Type: "points.added", Topic: "member.points.events", AggregateID: "m-x", Version: 1, Payload: []byte(`{}`)})
	})
	s := newStack(t, broken, "member-service")
	if a := s.push(t, message(t, orderEvent("order-70", 1)), 1); a.code != http.StatusServiceUnavailable || a.res.Outcome != model.OutcomeRetry {
		t.Errorf("emit into a broken transaction: %+v, want 503 retry", a)
	}
	invalid := consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		return c.Emit(ctx, &event.Event{Type: "points.added", Topic: "Not A Topic", AggregateID: "m-x", Version: 1, Payload: []byte(`{}`)})
	})
	s2 := newStack(t, invalid, "member-service")
	if a := s2.push(t, message(t, orderEvent("order-71", 1)), 1); a.code != http.StatusOK || a.res.Outcome != model.OutcomeFailed || a.res.Code != "emit" {
		t.Errorf("emit of an invalid child: %+v, want 200 failed emit", a)
	}
}
