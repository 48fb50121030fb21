package relay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/internal/reexec"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

func TestMain(m *testing.M) {
	if role, url := reexec.Role(); role == childRole {
		os.Exit(childClaim(url))
	}
	pgtest.Main(m)
}

const topic = "shop.order.events"

// recorder sees every publish as it reaches the Pub/Sub server and can fail
// chosen ordering keys (a non-retryable code, so the client gives up at once).
type recorder struct {
	mu   sync.Mutex
	seen map[string][]int64 // ordering key -> versions, in arrival order
	fail map[string]int     // ordering key -> publishes still to refuse (-1: forever)
	msgs int
}

func newRecorder() *recorder { return &recorder{seen: map[string][]int64{}, fail: map[string]int{}} }

func (r *recorder) React(req any) (bool, any, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pr := req.(*pb.PublishRequest)
	for _, m := range pr.Messages {
		if n := r.fail[m.OrderingKey]; n != 0 {
			if n > 0 {
				r.fail[m.OrderingKey] = n - 1
			}
			return true, nil, status.Error(codes.PermissionDenied, "injected failure for "+m.OrderingKey)
		}
	}
	for _, m := range pr.Messages {
		v, _ := strconv.ParseInt(m.Attributes["version"], 10, 64)
		r.seen[m.OrderingKey] = append(r.seen[m.OrderingKey], v)
		r.msgs++
	}
	return false, nil, nil
}

func (r *recorder) versions(key string) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.seen[key]...)
}

// checkExactlyInOrder asserts every aggregate's events reached Pub/Sub
// exactly once, versions 1..n in order.
func (r *recorder) checkExactlyInOrder(t *testing.T, aggregates int, versions int64) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for a := range aggregates {
		key := aggKey(a)
		got := r.seen[key]
		if int64(len(got)) != versions {
			t.Errorf("%s: %d publishes, want %d", key, len(got), versions)
			continue
		}
		for i, v := range got {
			if v != int64(i+1) {
				t.Errorf("%s: publish %d carried version %d: order broken: %v", key, i, v, got)
				break
			}
		}
	}
}

func aggKey(a int) string { return fmt.Sprintf("order-%04d", a) }

// clock is the relays' clock in a test: real time plus an offset the test
// moves, so leases expire and retries come due when the test says, not
// after a sleep.
type clock struct{ offset atomic.Int64 }

func (c *clock) now() time.Time      { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *clock) add(d time.Duration) { c.offset.Add(int64(d)) }

type env struct {
	pool *pgxpool.Pool
	fake *pubsubtest.Fake
	rec  *recorder
	top  *topology.Topology
}

func newEnv(t testing.TB) *env {
	t.Helper()
	pool := pgtest.Schema(t)
	if err := outbox.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	fake := pubsubtest.New(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: rec})
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	fake.Provision(t, top)
	return &env{pool: pool, fake: fake, rec: rec, top: top}
}

func (e *env) relay(t *testing.T, o relay.Options) *relay.Relay {
	t.Helper()
	o.DB, o.Publisher, o.Topology = e.pool, e.fake.Client, e.top
	r, err := relay.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func ev(agg string, version int64) *event.Event {
	return &event.Event{ID: fmt.Sprintf("%s-v%d", agg, version), Type: "order.purchased", Source: "order-service",
		Topic: topic, AggregateID: agg, Version: version, Payload: []byte(`{"n":1}`)}
}

// fill enqueues versions 1..versions of each aggregate, interleaved the way
// a busy producer writes them, in transactions of up to 2,000 events.
func fill(t testing.TB, pool *pgxpool.Pool, aggregates int, versions int64) {
	t.Helper()
	ctx := context.Background()
	var batch []*event.Event
	flush := func() {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.Enqueue(ctx, tx, batch...); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		batch = batch[:0]
	}
	for v := int64(1); v <= versions; v++ {
		for a := range aggregates {
			batch = append(batch, ev(aggKey(a), v))
			if len(batch) == 2000 {
				flush()
			}
		}
	}
	if len(batch) > 0 {
		flush()
	}
}

func counts(t *testing.T, pool *pgxpool.Pool) outbox.Counts {
	t.Helper()
	c, err := outbox.Count(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRolledBackEnqueueLeavesNothingCommittedIsPublished(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	tx, _ := e.pool.Begin(ctx)
	if _, err := outbox.Enqueue(ctx, tx, ev("order-rolled-back", 1)); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	tx, _ = e.pool.Begin(ctx)
	if _, err := outbox.Enqueue(ctx, tx, ev("order-committed", 1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	sum, err := e.relay(t, relay.Options{}).Drain(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Claimed != 1 || sum.Published != 1 || sum.Remaining != 0 {
		t.Fatalf("summary %+v, want one claimed and published, none remaining", sum)
	}
	if got := e.rec.versions("order-rolled-back"); len(got) != 0 {
		t.Errorf("a rolled-back event was published: %v", got)
	}
	if got := e.rec.versions("order-committed"); len(got) != 1 {
		t.Errorf("the committed event reached Pub/Sub %d times, want 1", len(got))
	}
}

func TestFiveRelaysPublishEachEventOnceInVersionOrder(t *testing.T) {
	const aggregates, versions = 500, 40 // 20,000 events
	ctx := context.Background()
	e := newEnv(t)
	fill(t, e.pool, aggregates, versions)
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := relay.Summary{}
	deadline := time.Now().Add(2 * time.Minute)
	for i := range 5 {
		// Small batches, so the five really share the aggregates.
		r := e.relay(t, relay.Options{BatchSize: 100, Aggregates: 10, RunLimit: 15, Owner: fmt.Sprintf("relay-%d", i)})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				sum, err := r.Drain(ctx, 30*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				total.Claimed += sum.Claimed
				total.Published += sum.Published
				mu.Unlock()
				if sum.Remaining == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	if c := counts(t, e.pool); c.Pending != 0 || c.Failed != 0 {
		t.Fatalf("outbox still holds %+v", c)
	}
	if total.Published != aggregates*versions {
		t.Errorf("relays report %d published, want %d", total.Published, aggregates*versions)
	}
	e.rec.checkExactlyInOrder(t, aggregates, versions)
}

// A subscriber with message ordering receives each aggregate's events in
// version order (pstest delivers a key's messages in the order it stored
// them, one outstanding at a time).
func TestSubscriberReceivesVersionOrder(t *testing.T) {
	const aggregates, versions = 20, 10
	ctx := context.Background()
	e := newEnv(t)
	fill(t, e.pool, aggregates, versions)
	for i := range 3 {
		r := e.relay(t, relay.Options{BatchSize: 7, Aggregates: 3, RunLimit: 3, Owner: fmt.Sprintf("relay-%d", i)})
		go func() { _, _ = r.Drain(ctx, 20*time.Second) }()
	}
	sub := e.fake.Client.PubSub().Subscriber("shop.order.events.member-service-processor")
	got := map[string][]int64{}
	var mu sync.Mutex
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n := 0
	err := sub.Receive(cctx, func(_ context.Context, m *pubsub.Message) {
		v, _ := strconv.ParseInt(m.Attributes["version"], 10, 64)
		mu.Lock()
		got[m.OrderingKey] = append(got[m.OrderingKey], v)
		n++
		if n == aggregates*versions {
			cancel()
		}
		mu.Unlock()
		m.Ack()
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	for a := range aggregates {
		vs := got[aggKey(a)]
		if len(vs) != versions {
			t.Errorf("%s: received %d, want %d", aggKey(a), len(vs), versions)
			continue
		}
		for i, v := range vs {
			if v != int64(i+1) {
				t.Errorf("%s: received out of order: %v", aggKey(a), vs)
				break
			}
		}
	}
}

// cancellingPublisher cancels its relay's context after a number of
// publishes, as a Cloud Run instance shut down mid-batch would.
type cancellingPublisher struct {
	relay.Publisher
	after  int
	n      int
	mu     sync.Mutex
	cancel context.CancelFunc
}

func (c *cancellingPublisher) PublishBatch(ctx context.Context, topic string, msgs []event.Message) (int, error) {
	c.mu.Lock()
	c.n++
	if c.n == c.after {
		c.cancel()
	}
	c.mu.Unlock()
	return c.Publisher.PublishBatch(ctx, topic, msgs)
}

func TestCancelledMidBatchLosesNothing(t *testing.T) {
	const aggregates, versions = 50, 8
	e := newEnv(t)
	fill(t, e.pool, aggregates, versions)
	ctx, cancel := context.WithCancel(context.Background())
	pub := &cancellingPublisher{Publisher: e.fake.Client, after: 30, cancel: cancel}
	r, err := relay.New(relay.Options{DB: e.pool, Publisher: pub, Topology: e.top, BatchSize: 100, Aggregates: 10,
		RunLimit: 4, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = r.Drain(ctx, 10*time.Second)
	if c := counts(t, e.pool); c.Pending == 0 {
		t.Fatal("the cancelled relay published everything; the test cancelled nothing")
	}
	other := e.relay(t, relay.Options{BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	waitDrained(t, other, e.pool)
	e.rec.checkExactlyInOrder(t, aggregates, versions)
}

// childRole makes the test binary the killed relay (childClaim), with
// its database's URL.
const childRole = "relay-claim"

// childClaim is the killed relay: a separate process that claims
// aggregates and then hangs before publishing, until it is killed.
func childClaim(url string) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	runs, err := outbox.Claim(ctx, pool, outbox.ClaimOptions{Owner: "doomed", Lease: time.Minute, Aggregates: 20, RunLimit: 10, Limit: 60})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("claimed %d\n", len(runs))
	select {} // killed here, between claim and mark
}

func TestKilledRelayProcessLeasesExpireAndAnotherPublishes(t *testing.T) {
	const aggregates, versions = 40, 5
	e := newEnv(t)
	fill(t, e.pool, aggregates, versions)
	var schema string
	if err := e.pool.QueryRow(context.Background(), `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), reexec.Env(childRole, pgtest.SchemaURL(t, schema)))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _ := out.Read(buf) // "claimed N" once the leases are committed
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	t.Logf("child: %s", buf[:n])
	var leased int
	_ = e.pool.QueryRow(context.Background(), `SELECT count(*) FROM relaybus_outbox_dispatch WHERE lease_owner = 'doomed'`).Scan(&leased)
	if leased == 0 {
		t.Fatal("the killed relay held no leases; the test killed nothing")
	}
	var clk clock
	r := e.relay(t, relay.Options{Now: clk.now})
	sum, err := r.Drain(context.Background(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Remaining != leased*versions {
		t.Fatalf("before the killed relay's lease expired: %+v; want its %d aggregates' %d events left alone", sum, leased, leased*versions)
	}
	clk.add(time.Minute + time.Second) // the lease expires
	waitDrained(t, r, e.pool)
	e.rec.checkExactlyInOrder(t, aggregates, versions)
}

func waitDrained(t *testing.T, r *relay.Relay, pool *pgxpool.Pool) {
	t.Helper()
	if !eventually.Within(30*time.Second, func() bool {
		sum, err := r.Drain(context.Background(), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return sum.Remaining == 0
	}) {
		t.Fatalf("outbox not drained: %+v", counts(t, pool))
	}
}

func TestPublishFailuresRetryWithBackoffAndBlockOnlyTheirKey(t *testing.T) {
	const aggregates, versions = 20, 3
	ctx := context.Background()
	e := newEnv(t)
	fill(t, e.pool, aggregates, versions)
	broken, flaky := aggKey(3), aggKey(7)
	e.rec.mu.Lock()
	e.rec.fail[broken] = -1
	e.rec.fail[flaky] = 2
	e.rec.mu.Unlock()
	base := 10 * time.Second
	var clk clock
	r := e.relay(t, relay.Options{MaxAttempts: 3, BackoffBase: base, BackoffMax: time.Minute, Now: clk.now})

	sum, err := r.Drain(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Retried != 2 || sum.Failed != 0 {
		t.Fatalf("first drain: %+v, want the two bad keys retried", sum)
	}
	for a := range aggregates {
		if k := aggKey(a); k != broken && k != flaky && len(e.rec.versions(k)) != versions {
			t.Errorf("%s was delayed by other keys' failures: %v", k, e.rec.versions(k))
		}
	}
	var attempts int
	var retryIn float64
	var lastErr string
	if err := e.pool.QueryRow(ctx, `SELECT attempts, extract(epoch FROM due_at - $2::timestamptz), coalesce(last_error, '')
		FROM relaybus_outbox_dispatch WHERE aggregateid = $1`, broken, clk.now()).Scan(&attempts, &retryIn, &lastErr); err != nil {
		t.Fatal(err)
	}
	// The backoff's jitter is ±20%: 8 to 12 s after the failure, read a
	// moment later.
	if attempts != 1 || retryIn <= 0.8*base.Seconds()-5 || retryIn > 1.2*base.Seconds() || lastErr == "" {
		t.Errorf("after one failure: attempts %d, retry in %.3fs, error %q; want 1, the %v backoff ±20%%, the error", attempts, retryIn, lastErr, base)
	}
	// Not due yet: nothing is attempted again.
	if sum, _ := r.Drain(ctx, time.Second); sum.Claimed != 0 {
		t.Errorf("a retry ran before its backoff: %+v", sum)
	}
	// Attempt 2 after 10 s (12 at most): both fail again. Attempt 3 after
	// 20 s more (24 at most): the flaky key recovers and publishes in order;
	// the broken one is FAILED.
	clk.add(base * 12 / 10)
	if sum, err := r.Drain(ctx, 5*time.Second); err != nil || sum.Retried != 2 {
		t.Fatalf("second attempt: %+v %v", sum, err)
	}
	clk.add(2 * base * 12 / 10)
	sum, err = r.Drain(ctx, 5*time.Second)
	if err != nil || sum.Failed != 1 || sum.Published != versions {
		t.Fatalf("third attempt: %+v %v; want the broken key FAILED and the flaky one's 3 published", sum, err)
	}
	if got := e.rec.versions(flaky); len(got) != versions || got[0] != 1 || got[2] != 3 {
		t.Errorf("flaky key after recovery: %v, want [1 2 3]", got)
	}
	if got := e.rec.versions(broken); len(got) != 0 {
		t.Errorf("the broken key published behind its failed head: %v", got)
	}
	st, err := outbox.Lookup(ctx, e.pool, broken+"-v1", broken+"-v2")
	if err != nil || st[broken+"-v1"].State != outbox.StateFailed || st[broken+"-v1"].LastError == "" || st[broken+"-v2"].State != outbox.StatePending {
		t.Errorf("FAILED aggregate: %+v %v", st, err)
	}
	if c := counts(t, e.pool); c.Failed != 1 || c.Blocked != versions-1 || c.Pending != 0 {
		t.Errorf("backlog %+v, want 1 failed and its %d followers blocked", c, versions-1)
	}
	// Nothing moves it now, however long we wait.
	clk.add(time.Hour)
	if sum, _ := r.Drain(ctx, time.Second); sum.Claimed != 0 {
		t.Errorf("a FAILED aggregate was claimed: %+v", sum)
	}
	// An operator re-pushes the head once the cause is fixed: the key flows again, in order.
	e.rec.mu.Lock()
	delete(e.rec.fail, broken)
	e.rec.mu.Unlock()
	if _, err := outbox.Repush(ctx, e.pool, ev(broken, 1), ""); err != nil {
		t.Fatal(err)
	}
	waitDrained(t, r, e.pool)
	e.rec.checkExactlyInOrder(t, aggregates, versions)
}

func TestPublishNow(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	r := e.relay(t, relay.Options{})
	if _, err := outbox.Enqueue(ctx, e.pool, ev("order-a", 1), ev("order-a", 2), ev("order-b", 1), ev("order-b", 2)); err != nil {
		t.Fatal(err)
	}
	// Another relay holds order-b.
	if _, err := outbox.Claim(ctx, e.pool, outbox.ClaimOptions{Owner: "other", Lease: time.Minute, Aggregates: 1, RunLimit: 1,
		Limit: 1, Events: []string{"order-b-v1"}}); err != nil {
		t.Fatal(err)
	}
	got, err := r.PublishNow(ctx, "order-a-v1", "order-b-v2", "unknown")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]outbox.State{"order-a-v1": outbox.StatePublished, "order-b-v2": outbox.StatePending}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("PublishNow = %v, want %v", got, want)
	}
	if v := e.rec.versions("order-b"); len(v) != 0 {
		t.Errorf("order-b published while another relay held it: %v", v)
	}
	// order-a went as a run: v2 with v1, in order.
	if v := e.rec.versions("order-a"); fmt.Sprint(v) != "[1 2]" {
		t.Errorf("order-a published %v, want its run [1 2]", v)
	}
	got, _ = r.PublishNow(ctx, "order-a-v2")
	if got["order-a-v2"] != outbox.StatePublished {
		t.Errorf("order-a-v2: %v", got)
	}
	if v := e.rec.versions("order-a"); len(v) != 2 {
		t.Errorf("order-a published again: %v", v)
	}
}

func TestRetentionDeletesOldPublishedRows(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	fill(t, e.pool, 3, 2)
	r := e.relay(t, relay.Options{Retention: time.Hour})
	if _, err := r.Drain(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE relaybus_outbox SET created_at = now() - interval '2 hours' WHERE aggregateid = $1`, aggKey(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, e.pool, ev(aggKey(1), 3)); err != nil {
		t.Fatal(err)
	}
	sum, err := r.Drain(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var left int
	_ = e.pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_outbox`).Scan(&left)
	if sum.Purged != 2 || left != 5 {
		t.Errorf("purged %d, %d rows left; want the 2 old rows gone and 5 kept", sum.Purged, left)
	}
}

// A deep backlog (50 aggregates × 2,000 versions) drains, every event once,
// every aggregate in version order, with several relays at once.
func TestDeepBacklogDrainsInOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 events")
	}
	const aggregates, versions = 50, 2000
	ctx := context.Background()
	e := newEnv(t)
	// No subscriptions: only what reaches the server matters here.
	for _, c := range e.top.Consumers() {
		_ = e.fake.Client.PubSub().SubscriptionAdminClient.DeleteSubscription(ctx, &pb.DeleteSubscriptionRequest{
			Subscription: "projects/" + pubsubtest.Project + "/subscriptions/" + c.Subscription()})
	}
	fill(t, e.pool, aggregates, versions)
	// A lease that outlives the run: this test is about several relays
	// sharing a backlog, not about a lease expiring mid-batch (a relay
	// starved past its lease republishes what it had sent: at least once,
	// TestARelayPausedPastItsLeaseCannotPublishOutOfOrderOrMoveTheCursor).
	// Under -race on a loaded machine a 20 s lease did expire here.
	var wg sync.WaitGroup
	for i := range 3 {
		r := e.relay(t, relay.Options{Owner: fmt.Sprintf("relay-%d", i), Lease: 10 * time.Minute})
		wg.Add(1)
		go func() {
			defer wg.Done()
			sum, err := r.Drain(ctx, 2*time.Minute)
			if err != nil {
				t.Error(err)
			}
			if sum.Lost != 0 {
				t.Errorf("relay-%d lost %d runs to an expired lease", i, sum.Lost)
			}
		}()
	}
	wg.Wait()
	waitDrained(t, e.relay(t, relay.Options{}), e.pool)
	e.rec.checkExactlyInOrder(t, aggregates, versions)
}

// pausingPublisher blocks after its first publish returns, until released,
// as a relay paused (GC, a starved CPU, a stopped VM) in the middle of a
// batch would be.
type pausingPublisher struct {
	relay.Publisher
	once     sync.Once
	paused   chan struct{}
	released chan struct{}
}

func (p *pausingPublisher) PublishBatch(ctx context.Context, topic string, msgs []event.Message) (int, error) {
	n, err := p.Publisher.PublishBatch(ctx, topic, msgs)
	p.once.Do(func() {
		close(p.paused)
		<-p.released
	})
	return n, err
}

// A relay whose lease expires while it is paused mid-batch, and is taken
// over, publishes nothing more once it wakes and cannot move the cursor:
// Pub/Sub sees the new holder's run last.
func TestARelayPausedPastItsLeaseCannotPublishOutOfOrderOrMoveTheCursor(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	// One aggregate whose run spans two topics: two publish requests, in
	// order; the pause comes between them.
	mk := func(v int64, topic string) *event.Event {
		x := ev("order-p", v)
		x.Topic, x.AggregateType = topic, "order"
		return x
	}
	if _, err := outbox.Enqueue(ctx, e.pool, mk(1, topic), mk(2, topic), mk(3, "member.points.events")); err != nil {
		t.Fatal(err)
	}
	var clkA, clkB clock
	pub := &pausingPublisher{Publisher: e.fake.Client, paused: make(chan struct{}), released: make(chan struct{})}
	a, err := relay.New(relay.Options{DB: e.pool, Publisher: pub, Topology: e.top, Now: clkA.now, Lease: time.Minute, Owner: "relay-a", Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	b := e.relay(t, relay.Options{Now: clkB.now, Lease: time.Minute, Owner: "relay-b"})
	done := make(chan relay.Summary)
	go func() {
		sum, _ := a.Drain(ctx, time.Minute)
		done <- sum
	}()
	<-pub.paused // A published v1 and v2, and stopped before v3
	clkA.add(2 * time.Minute)
	clkB.add(2 * time.Minute) // A's lease has expired: B takes the aggregate over
	if sum, err := b.Drain(ctx, 10*time.Second); err != nil || sum.Published != 3 {
		t.Fatalf("the relay that took over: %+v %v; want the whole run published", sum, err)
	}
	close(pub.released)
	sumA := <-done
	if sumA.Published != 0 || sumA.Lost != 1 {
		t.Errorf("the paused relay: %+v; want nothing settled and its run lost", sumA)
	}
	// Pub/Sub: A's v1 v2, then B's v1 v2 v3, and nothing of A's after.
	if got := fmt.Sprint(e.rec.versions("order-p")); got != "[1 2 1 2 3]" {
		t.Errorf("Pub/Sub received %s, want [1 2 1 2 3] (A's first request, then B's run)", got)
	}
	var cursor, epoch int64
	if err := e.pool.QueryRow(ctx, `SELECT published_version, epoch FROM relaybus_outbox_dispatch WHERE aggregateid = 'order-p'`).Scan(&cursor, &epoch); err != nil {
		t.Fatal(err)
	}
	if cursor != 3 || epoch != 2 {
		t.Errorf("cursor %d at epoch %d, want B's: 3 at epoch 2", cursor, epoch)
	}
	if c := counts(t, e.pool); c.Pending != 0 || c.Leased != 0 {
		t.Errorf("backlog %+v", c)
	}
}

// A kick's settle waits SettleWait for others; a version of one of its
// aggregates enqueued meanwhile cannot be claimed (the aggregate is still
// leased) and is kicked as soon as the settle finds it, with no drain:
// published right after the version before it, in order.
func TestAVersionEnqueuedWhileItsAggregateWaitsForTheSettleIsKicked(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	r := e.relay(t, relay.Options{SettleWait: 2 * time.Second})
	enqueueAndKickIn := func(v int64) {
		t.Helper()
		var publish func()
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			enq, err := outbox.Enqueue(ctx, tx, ev("order-r", v))
			if err != nil {
				return err
			}
			publish, err = r.KickIn(ctx, tx, enq[0].ID)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		publish()
	}
	enqueueAndKickIn(1)
	eventually.True(t, 20*time.Second, "v1 published after its KickIn", func() bool { return len(e.rec.versions("order-r")) >= 1 })
	// v1 is on Pub/Sub, its settle waiting: v2's claim finds the aggregate leased.
	enqueueAndKickIn(2)
	eventually.True(t, 20*time.Second, "v2 published without a drain", func() bool { return len(e.rec.versions("order-r")) >= 2 })
	if v := e.rec.versions("order-r"); fmt.Sprint(v) != "[1 2]" {
		t.Errorf("order-r published %v, want [1 2]", v)
	}
	if err := r.FlushKicks(ctx); err != nil {
		t.Fatal(err)
	}
}
