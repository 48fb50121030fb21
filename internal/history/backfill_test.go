package history_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/history"
	"github.com/relaybus/relaybus/internal/pack"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/relaybustest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	topic     = "shop.order.events"
	newbie    = "new-service"    // the consumer backfilled
	bystander = "member-service" // another consumer of the topic
)

// producer is a producer's outbox drained by a real relay into pstest.
type producer struct {
	db   *pgxpool.Pool
	fake *pubsubtest.Fake
	r    *relay.Relay
	seen int
}

func newProducer(t *testing.T) *producer {
	t.Helper()
	db := pgtest.Schema(t)
	if err := outbox.Migrate(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	top := joined(t)
	fake := pubsubtest.New(t)
	fake.Provision(t, top)
	// Packs of up to 3 events: the backfill's messages are packs, and
	// few enough events each that live versions fall between them.
	r, err := relay.New(relay.Options{DB: db, Publisher: fake.Client, Topology: top, Retention: -1, MaxPack: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return &producer{db: db, fake: fake, r: r}
}

func (p *producer) enqueue(t *testing.T, agg string, from, to int64) {
	t.Helper()
	var evs []*event.Event
	for v := from; v <= to; v++ {
		evs = append(evs, &event.Event{ID: fmt.Sprintf("%s-v%d", agg, v), Type: "order.purchased", Source: "order-service",
			Topic: topic, AggregateID: agg, Version: v, Payload: []byte(fmt.Sprintf(`{"v":%d}`, v))})
	}
	if _, err := outbox.Enqueue(context.Background(), p.db, evs...); err != nil {
		t.Fatal(err)
	}
}

// drain runs the relay and returns what it published since the last drain.
func (p *producer) drain(t *testing.T) []event.Message {
	t.Helper()
	if _, err := p.r.Drain(context.Background(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	all := p.fake.Server.Messages()
	var out []event.Message
	for _, m := range all[p.seen:] {
		out = append(out, event.Message{ID: m.ID, Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey,
			PublishTime: m.PublishTime, Topic: topic})
	}
	p.seen = len(all)
	return out
}

// history moves every published row into the history, as retention does.
func (p *producer) history(t *testing.T) {
	t.Helper()
	if _, err := outbox.PurgeWith(context.Background(), p.db, outbox.PurgeOptions{Before: time.Now().Add(time.Minute), Limit: 1000,
		History: outbox.History{Default: 24 * time.Hour}}); err != nil {
		t.Fatal(err)
	}
}

// ids are the ids of the events ms carry, in order (a pack's each).
func ids(t *testing.T, ms []event.Message) []string {
	t.Helper()
	var out []string
	for _, m := range ms {
		for _, im := range unpack(t, m) {
			out = append(out, im.Attributes[event.AttrEventID])
		}
	}
	return out
}

// unpack is the messages m carries: a pack's, or m itself.
func unpack(tb testing.TB, m event.Message) []event.Message {
	tb.Helper()
	if !pack.Is(m) {
		return []event.Message{m}
	}
	inner, err := pack.Decode(m)
	if err != nil {
		tb.Error(err)
	}
	return inner
}

func handle(t *testing.T, k *relaybustest.Kit, consumerID string, m event.Message) consumer.Result {
	t.Helper()
	return k.Engine.Handle(context.Background(), delivery.Delivery{Mode: delivery.ModePush,
		Subscription: topic + "." + consumerID + "-sub", Message: m})
}

// applied records the versions a strict handler applies, in order.
func applied(ctx context.Context, db *pgxpool.Pool) error {
	_, err := db.Exec(ctx, `CREATE TABLE applied (n bigserial PRIMARY KEY, aggregate text NOT NULL, version bigint NOT NULL)`)
	return err
}

func recorder() consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		_, err := c.Tx.Exec(ctx, `INSERT INTO applied (aggregate, version) VALUES ($1, $2)`, c.Event.AggregateID, c.Event.Version)
		return err
	})
}

func appliedVersions(t testing.TB, db *pgxpool.Pool) map[string][]int64 {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT aggregate, version FROM applied ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string][]int64{}
	for rows.Next() {
		var a string
		var v int64
		if err := rows.Scan(&a, &v); err != nil {
			t.Fatal(err)
		}
		out[a] = append(out[a], v)
	}
	return out
}

func upTo(n int64) []int64 {
	var vs []int64
	for v := int64(1); v <= n; v++ {
		vs = append(vs, v)
	}
	return vs
}

// A consumer that joins late is backfilled from the history (rows the
// outbox's retention moved there and published rows still in the outbox)
// while live versions of the same aggregates reach it first and in
// between: the strict handler applies every version once, in order; the
// state projection's version never goes back; a backfill paused and
// resumed queues every event once; another consumer of the topic takes
// none of the backfill's messages.
func TestBackfillMeetsTheLiveStreamWithoutReorder(t *testing.T) {
	ctx := context.Background()
	p := newProducer(t)

	// Before the new consumer exists: A 1..6 and B 1..4 published and
	// moved to the history; A 7 and B 5 published, still in the outbox.
	p.enqueue(t, "A", 1, 6)
	p.enqueue(t, "B", 1, 4)
	p.drain(t)
	p.history(t)
	p.enqueue(t, "A", 7, 7)
	p.enqueue(t, "B", 5, 5)
	p.drain(t)

	// The consumer subscribes (the watermark); its backfill is created.
	since, watermark := time.Now().Add(-time.Hour), time.Now()
	spec := history.Spec{Topic: topic, Consumer: newbie, Since: since, Until: watermark, Rate: 1000, By: "test"}
	if n, err := history.Count(ctx, p.db, spec); err != nil || n != 12 {
		t.Fatalf("dry run counts %d (%v), want 12", n, err)
	}
	id := history.NewID(time.Now())
	bf, err := history.Start(ctx, p.db, id, spec)
	if err != nil || bf.Matched != 12 || bf.State != history.StateRunning {
		t.Fatalf("start: %+v %v", bf, err)
	}

	// Live, after the watermark: A 8, 9 and B 6.
	p.enqueue(t, "A", 8, 9)
	p.enqueue(t, "B", 6, 6)
	live := p.drain(t)
	// Order holds per aggregate; the two aggregates' runs may come in
	// either order, so the seam below takes them by id: A 8, A 9, B 6.
	got := ids(t, live)
	if !slices.Equal(slices.Sorted(slices.Values(got)), []string{"A-v8", "A-v9", "B-v6"}) || slices.Index(got, "A-v8") > slices.Index(got, "A-v9") {
		t.Fatalf("live messages %v, want A-v8 before A-v9, and B-v6", got)
	}
	slices.SortStableFunc(live, func(a, b event.Message) int {
		return strings.Compare(a.Attributes[event.AttrEventID], b.Attributes[event.AttrEventID])
	})

	// The backfill: a step, a pause (a step then queues nothing), a resume, the rest.
	if bf, n, err := history.Step(ctx, p.db, id, 5); err != nil || n != 5 || bf.Queued != 5 || bf.CursorID != "A" || bf.CursorVersion != 5 {
		t.Fatalf("first step: %d queued, %+v %v", n, bf, err)
	}
	if bf, err := history.Set(ctx, p.db, id, history.ActionPause); err != nil || bf.State != history.StatePaused || bf.Remaining != 7 {
		t.Fatalf("pause: %+v %v", bf, err)
	}
	if _, n, err := history.Step(ctx, p.db, id, 5); err != nil || n != 0 {
		t.Fatalf("a paused backfill queued %d (%v)", n, err)
	}
	if _, err := history.Set(ctx, p.db, id, history.ActionPause); !errors.Is(err, history.ErrState) {
		t.Fatalf("pausing a paused backfill: %v, want ErrState", err)
	}
	if _, err := history.Set(ctx, p.db, id, history.ActionResume); err != nil {
		t.Fatal(err)
	}
	bf, err = history.Run(ctx, p.db, id, time.Now().Add(time.Minute))
	if err != nil || bf.State != history.StateDone || bf.Queued != 12 || bf.Remaining != 0 {
		t.Fatalf("run: %+v %v", bf, err)
	}
	back := p.drain(t)
	want := []string{"A-v1", "A-v2", "A-v3", "A-v4", "A-v5", "A-v6", "A-v7", "B-v1", "B-v2", "B-v3", "B-v4", "B-v5"}
	if got := ids(t, back); !slices.Equal(got, want) {
		t.Fatalf("backfill published %v, want each event once, in order: %v", got, want)
	}
	// In packs of 3: A 1-3, A 4-6, A 7, B 1-3, B 4-5.
	if len(back) != 5 {
		t.Fatalf("the backfill's 12 events travelled in %d messages, want 5 (packs of up to 3 per aggregate)", len(back))
	}
	for _, m := range back {
		if m.Attributes[topology.TargetConsumerAttr] != newbie || m.OrderingKey == "" {
			t.Fatalf("backfill message %s: target %q, ordering key %q", m.ID, m.Attributes[topology.TargetConsumerAttr], m.OrderingKey)
		}
	}

	// Interleaved at the seam: live A 8 before all its predecessors, live
	// B 6 before B's backfill, live A 9 before A 7, one backfilled pack
	// delivered twice.
	seam := []event.Message{live[0], back[0], live[2], back[1], back[3], live[1], back[2], back[4], back[0]}

	strict := relaybustest.New(t, projection.Strict(recorder()), relaybustest.Options{ConsumerID: newbie, DatabaseURL: pgtest.URL(t), Migrate: applied})
	latest := relaybustest.New(t, projection.Latest(), relaybustest.Options{ConsumerID: newbie, DatabaseURL: pgtest.URL(t)})
	other := relaybustest.New(t, recorder(), relaybustest.Options{ConsumerID: bystander, DatabaseURL: pgtest.URL(t), Migrate: applied})
	held := map[string]int64{}
	reorders := 0
	for _, m := range seam {
		for _, k := range []*relaybustest.Kit{strict, latest} {
			if r := handle(t, k, newbie, m); r.Status != 200 || r.Error != "" {
				t.Fatalf("%s: %+v", m.Attributes[event.AttrEventID], r)
			}
		}
		agg := m.OrderingKey // a pack's events' aggregate
		v, err := projection.HeldVersion(ctx, latest.DB, topology.HandlerProjection, newbie, "order", agg)
		if err != nil {
			t.Fatal(err)
		}
		if v < held[agg] {
			reorders++
		}
		held[agg] = v
		r := handle(t, other, bystander, m)
		if _, backfilled := m.Attributes[topology.TargetConsumerAttr]; backfilled && !r.Ignored {
			t.Fatalf("%s reached %s: %+v", m.Attributes[event.AttrEventID], bystander, r)
		}
	}
	if got := appliedVersions(t, strict.DB); !slices.Equal(got["A"], upTo(9)) || !slices.Equal(got["B"], upTo(6)) {
		t.Errorf("strict handler applied %v, want A 1..9 and B 1..6, each once, in order", got)
	}
	if reorders != 0 || held["A"] != 9 || held["B"] != 6 {
		t.Errorf("projection: %d reorders, holds A %d B %d; want 0, 9 and 6", reorders, held["A"], held["B"])
	}
	if got := appliedVersions(t, other.DB); !slices.Equal(got["A"], []int64{8, 9}) || !slices.Equal(got["B"], []int64{6}) {
		t.Errorf("%s applied %v, want only the live A 8, 9 and B 6", bystander, got)
	}
}
