package dlqreplay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/pack"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pull"
	"github.com/relaybus/relaybus/internal/pullengine"
	"github.com/relaybus/relaybus/shared/broker/brokertest/natstest"
	"github.com/relaybus/relaybus/shared/broker/nats"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/topology"
)

// countingEngine counts what the real consume engine answered the pull
// worker: deliveries applied (not duplicates), duplicates and holds.
type countingEngine struct {
	pull.Engine
	mu         sync.Mutex
	applied    map[string]int // event id → times applied
	duplicates int
	held       int
	attempts   map[string][]int // event id → the attempt numbers applied
}

func (c *countingEngine) Handle(ctx context.Context, d delivery.Delivery) pull.Answer {
	a := c.Engine.Handle(ctx, d)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case a.Held:
		c.held++
	case a.Status == http.StatusOK && pack.Is(d.Message):
		// A pack acknowledged: each of its events applied (the
		// rebuild from the history sends them so; the inbox was cleared).
		inner, err := pack.Decode(d.Message)
		if err != nil {
			panic(err)
		}
		for _, m := range inner {
			c.applied[m.Attributes[event.AttrEventID]]++
		}
	case a.Status == http.StatusOK && a.Attempt == 0:
		c.duplicates++
	case a.Status == http.StatusOK:
		c.applied[a.EventID]++
		c.attempts[a.EventID] = append(c.attempts[a.EventID], a.Attempt)
	}
	return a
}

func (c *countingEngine) counts() (applied, duplicates, held int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.applied {
		applied += n
	}
	return applied, c.duplicates, c.held
}

// Pause, resume and rebuild of a pull consumer on NATS JetStream, which
// has no pause of its own, by the consumer's own flag, with a real consume
// engine pulled by a real worker over an embedded NATS server and real
// Postgres: a pause stops the worker pulling (the messages published
// meanwhile wait in JetStream, none is delivered, no attempt spent); a
// resume delivers them, each at its first attempt; a rebuild pauses,
// seeks the durable consumer back, clears the projection and inbox and
// resumes, and the worker applies every event again (counted as the
// engine answers it, not simulated), leaving the same projection; a
// rebuild from the event history does the same without a seek, its
// backfills published by the relay to JetStream. The events come from the
// outbox through a relay, as in production.
func TestPauseResumeAndRebuildAPullConsumerOnNATS(t *testing.T) {
	ctx := context.Background()
	emutest.Host(t, emulator.Firestore)
	nc, err := nats.Connect(ctx, natstest.Server(t), nats.Options{PullWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	top, _ := topology.Load("")
	if err := nc.Provision(ctx, top); err != nil {
		t.Fatal(err)
	}
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: emutest.FirestoreProject(t)}, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	db := pgtest.Schema(t)
	if err := inbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := projection.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	const topic, sub, consumerID = "member.points.events", "member.points.events.audit-service-recorder", "audit-service"
	h, err := dlqreplay.New(dlqreplay.Options{Archive: archive.New(store.Client()), Ledger: store, DB: db,
		Publisher: nc, Auth: dlqreplay.AuthNone, Writers: []string{dlqreplay.Anonymous}, Broker: nc, Topology: top,
		PullConsumers: []string{sub}, PauseSettle: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	call := func(method, path string, body any) (int, map[string]any) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, srv.URL+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}

	// The consumer as consume runs it in pull mode (consume.Build):
	// the projection engine, the worker asking the consumer's flag.
	eng, err := consumer.New(consumer.Options{DB: db, ConsumerID: consumerID, Subscription: sub, Handler: projection.Latest(), DeadLetters: nc})
	if err != nil {
		t.Fatal(err)
	}
	flags := &inbox.PauseFlags{DB: db, ConsumerID: consumerID, Every: 50 * time.Millisecond}
	counter := &countingEngine{Engine: pullengine.New(eng, flags), applied: map[string]int{}, attempts: map[string][]int{}}
	var askedPaused atomic.Int64 // pulls the worker skipped, paused
	paused := pullengine.Paused(flags, topic)
	w, err := pull.New(pull.Options{Source: nc, Subscription: sub, Engine: counter, DeadLetters: nc, MaxAttempts: 3,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		Paused: func(ctx context.Context) (bool, time.Duration) {
			p, d := paused(ctx)
			if p {
				askedPaused.Add(1)
			}
			return p, d
		}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() {
		stop()
		<-done
	}()

	// The producer: the outbox and a relay publishing to JetStream.
	drain := func() { t.Helper(); drainOutbox(t, db, nc, top) }
	start := time.Now().Add(-time.Second)
	publish := func(from, to int64) {
		t.Helper()
		var evs []*event.Event
		for v := from; v <= to; v++ {
			evs = append(evs, &event.Event{ID: fmt.Sprintf("evt-m-1-%d", v), Type: "points.added", Source: "member-service", Topic: topic,
				AggregateType: "member", AggregateID: "m-1", Version: v, Payload: []byte(fmt.Sprintf(`{"points":%d}`, 10*v))})
		}
		if _, err := outbox.Enqueue(ctx, db, evs...); err != nil {
			t.Fatal(err)
		}
		drain()
	}
	inboxRows := func() int {
		var n int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox WHERE consumer_id = $1`, consumerID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	projected := func() string {
		var s string
		if err := db.QueryRow(ctx, `SELECT version || ' ' || event_id FROM relaybus_projection WHERE consumer_id = $1 AND aggregate_id = 'm-1'`, consumerID).Scan(&s); err != nil {
			return err.Error()
		}
		return s
	}
	waiting := func() (pending uint64, ackPending int) {
		cons, err := nc.JetStream().Consumer(ctx, nats.StreamName(topic), nats.ConsumerName(sub))
		if err != nil {
			t.Fatal(err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.NumPending, info.NumAckPending
	}

	publish(1, 3)
	eventually.True(t, 10*time.Second, "the first 3 events applied", func() bool { return inboxRows() == 3 })

	code, st := call("POST", "/consumers/"+topic+"/"+consumerID+":pause", nil)
	if code != 200 || st["paused"] != true || st["changed"] != true || st["control"] != dlqreplay.ControlConsumerFlag || st["delivery"] != "pull" {
		t.Fatalf("pause: %d %v; want paused and changed by the consumer's flag, a pull consumer", code, st)
	}
	if done, _ := st["done"].(string); !bytes.Contains([]byte(done), []byte("stops pulling")) {
		t.Errorf("pause says %q; want it to say the worker stops pulling", done)
	}
	// The worker has seen the flag once it skips a pull.
	eventually.True(t, 10*time.Second, "the worker skipping pulls", func() bool { return askedPaused.Load() > 0 })
	publish(4, 5)
	// It keeps skipping pulls; the two wait in JetStream, not pulled.
	seen := askedPaused.Load()
	eventually.True(t, 10*time.Second, "more pulls skipped", func() bool { return askedPaused.Load() >= seen+5 })
	if p, ack := waiting(); p != 2 || ack != 0 {
		t.Errorf("while paused, JetStream holds %d messages not delivered and %d delivered unacknowledged; want 2 and 0: the worker stopped pulling", p, ack)
	}
	if n := inboxRows(); n != 3 {
		t.Errorf("while paused, %d events applied; want the first 3 only", n)
	}
	if code, st := call("GET", "/consumers/"+topic+"/"+consumerID+"/delivery", nil); code != 200 || st["paused"] != true {
		t.Errorf("delivery state while paused: %d %v", code, st)
	}
	if code, st := call("POST", "/consumers/"+topic+"/"+consumerID+":pause", nil); code != 200 || st["changed"] != false {
		t.Errorf("pause again: %d %v; want nothing changed", code, st)
	}

	code, st = call("POST", "/consumers/"+topic+"/"+consumerID+":resume", nil)
	if code != 200 || st["paused"] != false || st["changed"] != true {
		t.Fatalf("resume: %d %v", code, st)
	}
	eventually.True(t, 10*time.Second, "all 5 events applied after the resume", func() bool { return inboxRows() == 5 })
	for v := 1; v <= 5; v++ {
		id := fmt.Sprintf("evt-m-1-%d", v)
		counter.mu.Lock()
		got := counter.attempts[id]
		counter.mu.Unlock()
		if len(got) != 1 || got[0] != 1 {
			t.Errorf("%s applied at attempts %v; want once, at attempt 1 (a pause spends none)", id, got)
		}
	}
	before := projected()
	if before != "5 evt-m-1-5" {
		t.Fatalf("projection before the rebuild: %q", before)
	}
	applied0, dup0, _ := counter.counts()

	code, st = call("POST", "/consumers/"+topic+"/"+consumerID+":rebuild", map[string]any{"time": start.UTC().Format(time.RFC3339)})
	if code != 200 || st["resumed"] != true {
		t.Fatalf("rebuild: %d %v", code, st)
	}
	// The seek redelivers all five; the worker applies each again, as new.
	eventually.True(t, 15*time.Second, "every event applied again after the rebuild", func() bool {
		applied, _, _ := counter.counts()
		return applied-applied0 == 5 && inboxRows() == 5
	})
	_, dup1, _ := counter.counts()
	if dup1 != dup0 {
		t.Errorf("%d deliveries after the rebuild answered as duplicates; want none (the inbox was cleared)", dup1-dup0)
	}
	if got := projected(); got != before {
		t.Errorf("projection after the rebuild %q; want %q as before", got, before)
	}
	if code, st := call("GET", "/consumers/"+topic+"/"+consumerID+"/delivery", nil); code != 200 || st["paused"] != false {
		t.Errorf("delivery state after the rebuild: %d %v; want resumed", code, st)
	}

	// A rebuild from the event history, no seek: the backfills, driven
	// and published by the relay, reach the worker through JetStream,
	// addressed to audit-service, and are applied again.
	applied1, _, _ := counter.counts()
	asked := time.Now()
	code, st = call("POST", "/consumers/"+topic+"/"+consumerID+":rebuild", map[string]any{"history": true, "time": start.UTC().Format(time.RFC3339)})
	if code != 200 || st["resumed"] != true || inboxRows() != 0 {
		t.Fatalf("rebuild from the history: %d %v (inbox %d)", code, st, inboxRows())
	}
	bfs, _ := st["backfills"].([]any)
	if len(bfs) == 0 {
		t.Fatalf("rebuild from the history started no backfill: %v", st)
	}
	for _, b := range bfs {
		// Its watermark is taken once the pause has settled (300 ms
		// here): what the consumer applied before the pause took effect
		// was cleared, and is in the backfill.
		until, err := time.Parse(time.RFC3339Nano, b.(map[string]any)["until"].(string))
		if err != nil || until.Before(asked.Add(300*time.Millisecond)) {
			t.Errorf("backfill until %v (%v), want after the pause settled, at least %v", until, err, asked.Add(300*time.Millisecond))
		}
		id := b.(map[string]any)["id"].(string)
		if code, run := call("POST", "/backfills/"+id+":run", nil); code != 200 || run["state"] != "done" {
			t.Fatalf("drive backfill %s: %d %v", id, code, run)
		}
	}
	drain()
	eventually.True(t, 15*time.Second, "every event applied again after the rebuild from the history", func() bool {
		applied, _, _ := counter.counts()
		return applied-applied1 == 5 && inboxRows() == 5
	})
	if _, dup2, _ := counter.counts(); dup2 != dup0 {
		t.Errorf("%d deliveries after the rebuild from the history answered as duplicates; want none", dup2-dup0)
	}
	if got := projected(); got != before {
		t.Errorf("projection after the rebuild from the history %q; want %q as before", got, before)
	}
}
