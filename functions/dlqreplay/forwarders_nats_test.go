package dlqreplay_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/broker/brokertest/natstest"
	"github.com/relaybus/relaybus/shared/broker/nats"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/forward"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

// natsForwardersTopology is a topology with one topic and one declared
// consumer, whose defaults (the forwarders' retry and dead-letter
// settings) retry after a second and dead-letter at the fifth attempt.
const natsForwardersTopology = `
rollup: {topic: relaybus.ledger.rollup}
defaults:
  min_backoff_seconds: 1
  max_backoff_seconds: 1
  max_delivery_attempts: 5
topics:
  - name: shop.order.events
    consumers:
      - service: member-service
`

// natsForwardersStack is the operators' API and the forwarders consume
// service on NATS JetStream (an embedded server), as Terraform's nats
// transport deploys them: the API creates each forwarder's durable
// consumer, the service pulls them (CONSUMER_MODE=pull), over real
// Postgres and the Firestore emulator.
type natsForwardersStack struct {
	*env
	nc *nats.Client
}

func newNATSForwardersStack(t *testing.T) *natsForwardersStack {
	t.Helper()
	ctx := context.Background()
	emutest.Host(t, emulator.Firestore)
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(path, []byte(natsForwardersTopology), 0o644); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: emutest.FirestoreProject(t)}, ledger.Options{Registry: registry.FromTopology(top)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	pool, schema := pgtest.SchemaConfig(t, nil)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	url := natstest.Server(t)
	nc, err := nats.Connect(ctx, url, nats.Options{PullWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	if err := nc.Provision(ctx, top); err != nil {
		t.Fatal(err)
	}

	// The forwarders service as on NATS: pull mode. The breaker is off so
	// that a target that keeps failing is dead-lettered at the fifth
	// attempt (with it on, pull holds deliveries while it is open).
	fw, err := consume.Build(ctx, consume.Config{Env: instance.Env{ProjectID: "p", Topology: path},
		PubSub: instance.PubSub{Transport: instance.TransportNATS, NATSURL: url},
		DB:     instance.Database{URL: pgtest.SchemaURL(t, schema)}, ConsumerID: "forwarders", Handler: consume.HandlerForwarders,
		Mode: consume.ModePull, RollupTopic: top.Rollup.Topic, ForwardersRefresh: time.Nanosecond, PauseEvery: time.Nanosecond,
		ForwardBreakerThreshold: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fw.Close(context.Background()) })
	// Its URL serves its routes (ledger:ship, inbox:purge); nothing
	// pushes to it on NATS, and the API takes it as the sign it is
	// deployed.
	fwSrv := httptest.NewServer(fw)
	t.Cleanup(fwSrv.Close)

	arc := archive.New(store.Client())
	h, err := dlqreplay.New(dlqreplay.Options{Archive: arc, Ledger: store, DB: pool, Publisher: nc, Topology: top,
		Broker: nc, Writers: []string{dlqreplay.Anonymous}, Archivers: []string{dlqreplay.Anonymous}, RateLimit: -1, Auth: dlqreplay.AuthNone,
		Forwarders: dlqreplay.ForwardersOptions{URL: fwSrv.URL, Pull: true}})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/dlqreplay/", http.StripPrefix("/dlqreplay", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &natsForwardersStack{env: &env{url: srv.URL + "/dlqreplay", store: store, db: pool, archive: arc, top: top, h: h}, nc: nc}
}

// publish publishes versions from..to of aggregate agg on
// shop.order.events as the relay does (one ordered batch) and returns
// their event ids.
func (s *natsForwardersStack) publish(t *testing.T, agg string, from, to int) []string {
	t.Helper()
	var msgs []event.Message
	var ids []string
	for v := from; v <= to; v++ {
		id := fmt.Sprintf("evt-%s-%d", agg, v)
		e := &event.Event{ID: id, Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
			AggregateID: agg, Version: int64(v), Payload: []byte(`{"orderId":"` + agg + `"}`)}
		if err := e.Prepare(time.Now(), event.Limits{}); err != nil {
			t.Fatal(err)
		}
		m, err := cloudevent.Encode(e, event.EncodingJSON)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
		ids = append(ids, id)
	}
	if n, err := s.nc.PublishBatch(context.Background(), "shop.order.events", msgs); err != nil || n != len(msgs) {
		t.Fatalf("publish: %d of %d: %v", n, len(msgs), err)
	}
	return ids
}

// durable returns the durable consumer standing for subscription, or
// the server's error.
func (s *natsForwardersStack) durable(t *testing.T, subscription string) (*jetstream.ConsumerInfo, error) {
	t.Helper()
	c, err := s.nc.JetStream().Consumer(context.Background(), nats.StreamName("shop.order.events"), nats.ConsumerName(subscription))
	if err != nil {
		return nil, err
	}
	return c.CachedInfo(), nil
}

// The done-when on NATS JetStream: a forward consumer added by
// API gets a durable consumer of its own and receives the next events in
// order through the forwarders service's inbox, pulled by its worker;
// events published before it was added never reach it; a change of URL
// takes effect on the next event; removing it deletes its durable
// consumer, and nothing more reaches it while a forwarder still there
// receives the next event.
func TestAForwarderAddedByAPIOnNATSReceivesTheNextEventsInOrder(t *testing.T) {
	ctx := context.Background()
	s := newNATSForwardersStack(t)
	hook := newWebhook(t)

	before := s.publish(t, "order-7", 1, 2) // sent before the forwarder exists

	a := s.do(t, "POST", "/forwarders", map[string]any{"name": "crm-webhook", "topic": "shop.order.events", "url": hook.url,
		"maxInFlight": 4, "description": "The CRM's webhook."})
	if a.status != 200 {
		t.Fatalf("POST /forwarders: %d %s", a.status, a.raw)
	}
	fv, _ := a.body["forwarder"].(map[string]any)
	const sub = "shop.order.events.crm-webhook-forwarder"
	if fv["subscription"] != sub || fv["pushEndpoint"] != nil {
		t.Fatalf("added: %v, want subscription %s and no push endpoint", fv, sub)
	}
	// Its durable consumer: explicit acks, the topology's ack deadline,
	// from the next message on.
	info, err := s.durable(t, sub)
	if err != nil {
		t.Fatalf("the forwarder's durable consumer: %v", err)
	}
	if c := info.Config; c.DeliverPolicy != jetstream.DeliverNewPolicy || c.AckPolicy != jetstream.AckExplicitPolicy ||
		c.AckWait != time.Duration(s.top.Defaults.AckDeadlineSeconds)*time.Second {
		t.Fatalf("the durable consumer's settings: %+v", c)
	}

	next := s.publish(t, "order-7", 3, 6)
	if ids := hook.wait(t, len(next)); strings.Join(ids, ",") != strings.Join(next, ",") {
		t.Fatalf("the forwarder received %v, want the events sent after it was added, in order: %v (not %v)", ids, next, before)
	}
	var n int
	if err := s.db.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox WHERE consumer_id = 'crm-webhook'`).Scan(&n); err != nil || n != len(next) {
		t.Fatalf("inbox rows of crm-webhook: %d (%v), want %d", n, err, len(next))
	}
	var list map[string]any
	if code := s.call(t, "GET", "/consumers?topic=shop.order.events", nil, &list); code != 200 || !hasConsumer(list, "crm-webhook", true) {
		t.Fatalf("topic_consumers lacks the enabled forwarder: %d %v", code, list["consumers"])
	}

	// A new URL reaches the next event.
	hook2 := newWebhook(t)
	if c := s.do(t, "PATCH", "/forwarders/crm-webhook", map[string]any{"url": hook2.url}); c.status != 200 || c.body["changed"] != true {
		t.Fatalf("PATCH: %d %s", c.status, c.raw)
	}
	later := s.publish(t, "order-7", 7, 7)
	if ids := hook2.wait(t, 1); ids[0] != later[0] {
		t.Fatalf("the new URL received %v, want %v", ids, later)
	}

	// Removed: its durable consumer is gone and the ledger no longer
	// waits for it.
	if r := s.do(t, "DELETE", "/forwarders/crm-webhook", nil); r.status != 200 || r.body["removed"] != true {
		t.Fatalf("DELETE: %d %s", r.status, r.raw)
	}
	if _, err := s.durable(t, sub); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("the removed forwarder's durable consumer: %v, want not found", err)
	}
	if code := s.call(t, "GET", "/consumers?topic=shop.order.events", nil, &list); code != 200 || !hasConsumer(list, "crm-webhook", false) {
		t.Fatalf("after removal topic_consumers has: %v", list["consumers"])
	}
	// A forwarder added after it receives the next event; the removed one
	// does not.
	witness := newWebhook(t)
	if w := s.do(t, "POST", "/forwarders", map[string]any{"name": "ops-webhook", "topic": "shop.order.events", "url": witness.url}); w.status != 200 {
		t.Fatalf("POST /forwarders (ops-webhook): %d %s", w.status, w.raw)
	}
	last := s.publish(t, "order-7", 8, 8)
	if ids := witness.wait(t, 1); ids[0] != last[0] {
		t.Fatalf("the forwarder still there received %v, want %v", ids, last)
	}
	hook.mu.Lock()
	first := append([]string(nil), hook.ids...)
	hook.mu.Unlock()
	hook2.mu.Lock()
	second := append([]string(nil), hook2.ids...)
	hook2.mu.Unlock()
	if strings.Join(first, ",") != strings.Join(next, ",") || strings.Join(second, ",") != strings.Join(later, ",") {
		t.Fatalf("the removed forwarder's targets received %v and %v, want only %v and %v", first, second, next, later)
	}
	if r := s.do(t, "GET", "/forwarders/crm-webhook", nil); r.status != 404 {
		t.Fatalf("GET a removed forwarder: %d %s", r.status, r.raw)
	}
}

// `relaybus consumers pause/resume` on a forwarder on NATS JetStream,
// which has no pause of its own: the forwarder's own flag stops its pull
// worker (the answer says so), the events published meanwhile wait in its
// durable consumer, not forwarded and not acknowledged, while a forwarder beside
// it receives them; resuming forwards them in order, each at its first
// attempt (a pause spends none). A rebuild is refused, naming the
// backfill, and changes nothing.
func TestPauseResumeAndRebuildAForwarderOnNATS(t *testing.T) {
	ctx := context.Background()
	s := newNATSForwardersStack(t)
	hook, witness := newWebhook(t), newWebhook(t)
	const topic, name = "shop.order.events", "crm-webhook"
	const sub = topic + "." + name + "-forwarder"
	for n, url := range map[string]string{name: hook.url, "ops-webhook": witness.url} {
		if a := s.do(t, "POST", "/forwarders", map[string]any{"name": n, "topic": topic, "url": url}); a.status != 200 {
			t.Fatalf("POST /forwarders (%s): %d %s", n, a.status, a.raw)
		}
	}
	first := s.publish(t, "order-9", 1, 2)
	if ids := hook.wait(t, 2); strings.Join(ids, ",") != strings.Join(first, ",") {
		t.Fatalf("before the pause the forwarder received %v, want %v", ids, first)
	}
	witness.wait(t, 2)

	base := "/consumers/" + topic + "/" + name
	p := s.do(t, "POST", base+":pause", nil)
	if p.status != 200 || p.body["paused"] != true || p.body["changed"] != true || p.body["control"] != dlqreplay.ControlConsumerFlag ||
		p.body["delivery"] != "pull" || p.body["pausedBy"] != inbox.PausedByOperator {
		t.Fatalf("pause: %d %s; want paused by the operator through the forwarder's flag, a pull consumer", p.status, p.raw)
	}
	if done, _ := p.body["done"].(string); !strings.Contains(done, "stops pulling") {
		t.Errorf("pause says %q; want it to say the worker stops pulling", done)
	}
	if d := s.do(t, "GET", base+"/delivery", nil); d.status != 200 || d.body["paused"] != true {
		t.Errorf("delivery state while paused: %d %s", d.status, d.raw)
	}

	// Published while paused: the forwarder beside it receives them; the
	// paused one's durable consumer keeps both, unacknowledged.
	held := s.publish(t, "order-9", 3, 4)
	if ids := witness.wait(t, 2); strings.Join(ids, ",") != strings.Join(held, ",") {
		t.Fatalf("the forwarder beside it received %v, want %v", ids, held)
	}
	info, err := s.durable(t, sub)
	if err != nil {
		t.Fatal(err)
	}
	// Either not pulled, or pulled by a pull already waiting when the
	// pause came and held under its lease: neither acknowledged.
	if info.NumPending+uint64(info.NumAckPending) != 2 {
		t.Errorf("while paused, the durable consumer holds %d messages not delivered and %d delivered unacknowledged; want 2 in all, none acknowledged", info.NumPending, info.NumAckPending)
	}
	if n := hook.count(); n != 2 {
		t.Errorf("while paused, the forwarder's target received %d requests; want the 2 sent before the pause", n)
	}

	// A rebuild is refused, and says what to do instead.
	rb := s.do(t, "POST", base+":rebuild", map[string]any{"time": time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)})
	if msg, _ := rb.body["message"].(string); rb.status != 409 || rb.body["code"] != "handler" || !strings.Contains(msg, "backfill") {
		t.Errorf("rebuild of a forwarder: %d %s; want 409 handler naming the backfill", rb.status, rb.raw)
	}

	r := s.do(t, "POST", base+":resume", nil)
	if r.status != 200 || r.body["paused"] != false || r.body["changed"] != true {
		t.Fatalf("resume: %d %s", r.status, r.raw)
	}
	if ids := hook.wait(t, 2); strings.Join(ids, ",") != strings.Join(held, ",") {
		t.Fatalf("after the resume the forwarder received %v, want %v in order", ids, held)
	}
	for _, req := range hook.last(2) {
		if a := req.header.Get(forward.HeaderAttempt); a != "1" {
			t.Errorf("%s forwarded at attempt %s; want 1: a pause spends no attempt", req.header.Get("Ce-Id"), a)
		}
	}
	var n int
	if err := s.db.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox WHERE consumer_id = $1`, name).Scan(&n); err != nil || n != 4 {
		t.Errorf("inbox rows of %s: %d (%v), want 4", name, n, err)
	}

	// Removed while paused and added again under its name: the new one
	// starts unpaused and receives the next event.
	if p := s.do(t, "POST", base+":pause", nil); p.status != 200 || p.body["changed"] != true {
		t.Fatalf("pause again: %d %s", p.status, p.raw)
	}
	if d := s.do(t, "DELETE", "/forwarders/"+name, nil); d.status != 200 {
		t.Fatalf("DELETE: %d %s", d.status, d.raw)
	}
	again := newWebhook(t)
	if a := s.do(t, "POST", "/forwarders", map[string]any{"name": name, "topic": topic, "url": again.url}); a.status != 200 {
		t.Fatalf("POST /forwarders again: %d %s", a.status, a.raw)
	}
	if d := s.do(t, "GET", base+"/delivery", nil); d.status != 200 || d.body["paused"] != false {
		t.Errorf("the forwarder added again: delivery state %d %s, want not paused", d.status, d.raw)
	}
	next := s.publish(t, "order-9", 5, 5)
	if ids := again.wait(t, 1); ids[0] != next[0] {
		t.Fatalf("the forwarder added again received %v, want %v", ids, next)
	}
}

// JetStream filters no attributes: a forwarder with a filter is refused
// with 400 naming the field, and nothing is left of it (no registry row,
// no durable consumer, no expectation in topic_consumers).
func TestAForwarderWithAFilterIsRefusedOnNATS(t *testing.T) {
	s := newNATSForwardersStack(t)
	a := s.do(t, "POST", "/forwarders", map[string]any{"name": "crm-webhook", "topic": "shop.order.events",
		"url": "https://crm.example.com/hook", "filter": `attributes.event_type = "order.purchased"`})
	if a.status != 400 || !strings.Contains(a.raw, "filter") || !strings.Contains(a.raw, "JetStream") {
		t.Fatalf("POST with a filter: %d %s, want 400 naming the filter and JetStream", a.status, a.raw)
	}
	var list map[string]any
	if code := s.call(t, "GET", "/forwarders", nil, &list); code != 200 || len(list["forwarders"].([]any)) != 0 {
		t.Fatalf("after the refusal: %d %v", code, list)
	}
	if _, err := s.durable(t, "shop.order.events.crm-webhook-forwarder"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("a refused forwarder's durable consumer: %v, want not found", err)
	}
	if code := s.call(t, "GET", "/consumers?topic=shop.order.events", nil, &list); code != 200 || hasConsumer(list, "crm-webhook", true) {
		t.Fatalf("after the refusal topic_consumers has: %v", list["consumers"])
	}
}

// A forwarder whose target keeps failing is retried with the topology's
// backoff and, at max_delivery_attempts, dead-lettered to
// <topic>.dlq with its subscription named as the source, as a declared
// consumer's pull worker does; the key's next event follows it.
func TestAForwarderOnNATSDeadLettersAtMaxAttempts(t *testing.T) {
	ctx := context.Background()
	s := newNATSForwardersStack(t)
	// The target refuses the aggregate's first event every time and
	// takes the others.
	taken := make(chan string, 10)
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get("Ce-Id"); id != "evt-order-3-1" {
			w.WriteHeader(http.StatusNoContent)
			taken <- id
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer target.Close()
	if a := s.do(t, "POST", "/forwarders", map[string]any{"name": "crm-webhook", "topic": "shop.order.events", "url": target.URL + "/hook"}); a.status != 200 {
		t.Fatalf("POST /forwarders: %d %s", a.status, a.raw)
	}
	ids := s.publish(t, "order-3", 1, 2)
	select {
	case got := <-taken:
		if got != ids[1] {
			t.Fatalf("after the dead letter the target took %v, want %v", got, ids[1])
		}
	case <-time.After(time.Minute):
		t.Fatal("the target took nothing in a minute: the refused event was not dead-lettered")
	}
	ls, err := s.nc.Pull(ctx, "shop.order.events.dlq-monitor", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 {
		t.Fatalf("the dead-letter topic holds %d messages, want 1", len(ls))
	}
	m := ls[0].Message()
	if m.Attributes[event.AttrEventID] != ids[0] || !strings.HasSuffix(m.Attributes[deadletter.AttrSourceSubscription], "shop.order.events.crm-webhook-forwarder") ||
		m.Attributes[deadletter.AttrSourceDeliveryCount] != fmt.Sprint(s.top.Defaults.MaxDeliveryAttempts) {
		t.Fatalf("the dead letter: %v, want %s from the forwarder's subscription after %d attempts", m.Attributes, ids[0], s.top.Defaults.MaxDeliveryAttempts)
	}
}

// drain publishes what the stack's outbox holds (events and re-pushes)
// with a real relay on NATS.
func (s *natsForwardersStack) drain(t *testing.T) {
	t.Helper()
	drainOutbox(t, s.db, s.nc, s.top)
}

// From a chosen point on NATS: a forwarder added after events were
// published is fed them by a backfill (re-pushes addressed to it alone,
// through the relay), and the next live events follow, in order.
func TestAForwarderOnNATSIsBackfilledFromAChosenPoint(t *testing.T) {
	s := newNATSForwardersStack(t)
	backfillAForwarderFromAChosenPoint(t, s.env, s.drain, nil)
}
