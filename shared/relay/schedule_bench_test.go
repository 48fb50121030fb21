package relay_test

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/internal/percentile"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// The scheduled-lateness benchmark's parameters: make bench runs the
// defaults, BENCH.md's 1,000 events/s over a minute; a lower rate
// (-relay.scheduled.rate) shows where a busy machine's relay keeps up, and
// the comment line says the rate used.
var (
	benchSchedRate   = flag.Int("relay.scheduled.rate", 1000, "scheduled events per second of deliverAt (BENCH.md's figure: 1,000)")
	benchSchedWindow = flag.Duration("relay.scheduled.window", time.Minute, "the span their deliverAt times cover")
)

// schedAcks is a publisher that notes when the broker acknowledged each
// event, and what it acknowledged per ordering key for the order check.
type schedAcks struct {
	relay.Publisher
	sink  *benchcheck.Sink
	mu    sync.Mutex
	acked map[string]time.Time
	// slowest is the longest PublishBatch call.
	slowest time.Duration
}

func (p *schedAcks) PublishBatch(ctx context.Context, topic string, msgs []event.Message) (int, error) {
	start := time.Now()
	n, err := p.Publisher.PublishBatch(ctx, topic, msgs)
	at := time.Now()
	p.mu.Lock()
	p.slowest = max(p.slowest, at.Sub(start))
	for _, m := range msgs[:n] {
		id := m.Attributes[event.AttrEventID]
		if _, ok := p.acked[id]; !ok {
			p.acked[id] = at
		}
		p.sink.Got(m.OrderingKey, id)
	}
	p.mu.Unlock()
	return n, err
}

// BenchmarkScheduledLateness enqueues events whose deliverAt times are
// spread evenly over a window (rate per second, 1,000 aggregates, each
// aggregate's versions due one after the other), then runs a relay that
// drains back to back, and measures each event's lateness: its deliverAt
// to the broker's acknowledgement. An event acknowledged before its
// deliverAt, lost, duplicated or reordered fails the run.
func BenchmarkScheduledLateness(b *testing.B) {
	for range b.N {
		b.StopTimer()
		ctx := context.Background()
		pool, _ := pgtest.SchemaConfig(b, func(c *pgxpool.Config) { c.MaxConns = 16 })
		if err := outbox.Migrate(ctx, pool); err != nil {
			b.Fatal(err)
		}
		top, err := topology.Load("")
		if err != nil {
			b.Fatal(err)
		}
		pub, broker := benchPubSub(b, top)
		durable := pgtest.RequireDurable(b)
		const aggregates = 1000
		rate, window := *benchSchedRate, *benchSchedWindow
		total := int(float64(rate) * window.Seconds())
		step := time.Second / time.Duration(rate)
		// The enqueue must end before the first event is due: a lead
		// time, checked below.
		lead := 30 * time.Second
		t0 := time.Now().Add(lead)
		sink := benchcheck.NewSink()
		due := make(map[string]time.Time, total)
		var batch []*event.Event
		flush := func() {
			if _, err := outbox.Enqueue(ctx, pool, batch...); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
		for i := range total {
			e := ev(fmt.Sprintf("sched-%04d", i%aggregates), int64(i/aggregates)+1)
			e.DeliverAt = t0.Add(time.Duration(i) * step)
			due[e.ID] = e.DeliverAt.Truncate(time.Microsecond)
			sink.Sent(e.AggregateID, e.ID)
			batch = append(batch, e)
			if len(batch) == 2000 {
				flush()
			}
		}
		if len(batch) > 0 {
			flush()
		}
		if time.Now().After(t0) {
			b.Fatalf("enqueueing %d events took longer than the %s lead: the run prints no figure", total, lead)
		}
		if _, err := pool.Exec(ctx, `ANALYZE relaybus_outbox; ANALYZE relaybus_outbox_dispatch`); err != nil {
			b.Fatal(err)
		}
		clock := &schedAcks{Publisher: pub, sink: sink, acked: make(map[string]time.Time, total)}
		r, err := relay.New(relay.Options{DB: pool, Publisher: clock, Topology: top})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		end := t0.Add(window + 2*time.Minute)
		drains := 0
		for time.Now().Before(end) {
			if _, err := r.Drain(ctx, 10*time.Second); err != nil {
				b.Fatal(err)
			}
			drains++
			clock.mu.Lock()
			n := len(clock.acked)
			clock.mu.Unlock()
			if n == total {
				break
			}
		}
		b.StopTimer()
		_ = r.Close(ctx)
		sink.Require(b, "scheduled lateness")
		lat := make([]float64, 0, total)
		early := 0
		var worst string
		var worstLate time.Duration
		clock.mu.Lock()
		for id, at := range due {
			a, ok := clock.acked[id]
			if !ok {
				continue
			}
			if a.Before(at) {
				early++
			}
			if l := a.Sub(at); l > worstLate {
				worst, worstLate = id, l
			}
			lat = append(lat, float64(a.Sub(at).Microseconds())/1000)
		}
		clock.mu.Unlock()
		if len(lat) != total || early > 0 {
			b.Fatalf("scheduled lateness: %d of %d events published, %d before their deliverAt: the run prints no figure", len(lat), total, early)
		}
		slices.Sort(lat)
		pct := func(p float64) float64 { return percentile.Sorted(lat, p) }
		fmt.Printf("# scheduled lateness: %d events due at %d/s over %s (1,000 aggregates, each one's versions due in turn), enqueued ahead; a relay draining back to back (%d drains); deliverAt -> Pub/Sub ack over all %d events; Postgres %s; %s; p50 %.2f ms, p90 %.2f ms, max %.2f ms (%s, due %s after the first); slowest publish request %s\n",
			total, rate, window, drains, len(lat), durable, broker, pct(0.5), pct(0.9), lat[len(lat)-1], worst, due[worst].Sub(t0.Truncate(time.Microsecond)), clock.slowest.Round(time.Millisecond))
		benchcheck.Figure(b, "scheduled_lateness_p99_ms", pct(0.99), "ms")
	}
}
