package dlqreplay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/devstack"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// webhook is a forwarder's target: it records the ids of the events it
// is sent, in arrival order, and signals each.
type webhook struct {
	url  string
	mu   sync.Mutex
	ids  []string
	got  chan string
	subj []string
	// reqs are the requests' headers and bodies, in arrival order.
	reqs []received
}

// received is one request a webhook received.
type received struct {
	header http.Header
	body   []byte
}

func newWebhook(t *testing.T) *webhook {
	w := &webhook{got: make(chan string, 100)}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Ce-Id")
		body, _ := io.ReadAll(r.Body)
		w.mu.Lock()
		w.ids = append(w.ids, id)
		w.reqs = append(w.reqs, received{header: r.Header.Clone(), body: body})
		w.subj = append(w.subj, r.Header.Get("Ce-Subject"))
		w.mu.Unlock()
		rw.WriteHeader(http.StatusNoContent)
		w.got <- id
	}))
	t.Cleanup(srv.Close)
	w.url = srv.URL + "/hook"
	return w
}

// count is how many requests the webhook received.
func (w *webhook) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.reqs)
}

// last returns the last n requests the webhook received.
func (w *webhook) last(n int) []received {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]received(nil), w.reqs[len(w.reqs)-n:]...)
}

// wait returns the next n ids the webhook receives (failing after a
// minute: a bound, not a synchronization).
func (w *webhook) wait(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	timeout := time.After(time.Minute)
	for len(out) < n {
		select {
		case id := <-w.got:
			out = append(out, id)
		case <-timeout:
			t.Fatalf("the webhook received %v, want %d events", out, n)
		}
	}
	return out
}

// forwardersStack is the operators' API and the forwarders consume
// service over pstest, Postgres and the Firestore emulator, with the
// local stack's delivery loop standing in for push.
type forwardersStack struct {
	*env
	fake *pubsubtest.Fake
	wake *devstack.Wakeup
	// key is RELAYBUS_FORWARDERS_KEY of the API and the forwarders service.
	key string
	// skew moves the API's clock (secret rotations) by its nanoseconds.
	skew atomic.Int64
	// service is the forwarders service's configuration but its key.
	service consume.Config
}

// forwardersService builds a forwarders consume service of the stack
// with key as its RELAYBUS_FORWARDERS_KEY.
func (s *forwardersStack) forwardersService(t *testing.T, key string) http.Handler {
	t.Helper()
	cfg := s.service
	cfg.ForwardersKey = key
	fw, err := consume.Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fw.Close(context.Background()) })
	return fw
}

func newForwardersStack(t *testing.T) *forwardersStack {
	t.Helper()
	ctx := context.Background()
	emutest.Host(t, emulator.Firestore)
	top, err := topology.Load("")
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
	wake := devstack.NewWakeup()
	fake := pubsubtest.New(t, wake.Reactor())
	fake.Provision(t, top)

	// The forwarders service, as Terraform deploys it.
	s := &forwardersStack{fake: fake, wake: wake, key: forwarders.NewKey()}
	keys, err := forwarders.ParseKeys(s.key)
	if err != nil {
		t.Fatal(err)
	}
	s.service = consume.Config{Env: instance.Env{ProjectID: pubsubtest.Project},
		PubSub: instance.PubSub{EmulatorHost: fake.Server.Addr, Transport: "pubsub"},
		DB:     instance.Database{URL: pgtest.SchemaURL(t, schema)}, ConsumerID: "forwarders", Handler: consume.HandlerForwarders,
		RollupTopic: top.Rollup.Topic, ForwardersRefresh: time.Nanosecond}
	fw := s.forwardersService(t, s.key)
	mux := http.NewServeMux()
	mux.Handle("/forwarders/", http.StripPrefix("/forwarders", fw))
	fwSrv := httptest.NewServer(mux)
	t.Cleanup(fwSrv.Close)

	arc := archive.New(store.Client())
	h, err := dlqreplay.New(dlqreplay.Options{Archive: arc, Ledger: store, DB: pool, Publisher: fake.Client, Topology: top,
		Broker: fake.Client, Writers: []string{dlqreplay.Anonymous}, Archivers: []string{dlqreplay.Anonymous}, RateLimit: -1, Auth: dlqreplay.AuthNone,
		Forwarders: dlqreplay.ForwardersOptions{URL: fwSrv.URL + "/forwarders", NoDeadLetterPolicy: true, Keys: keys,
			Now: func() time.Time { return time.Now().Add(time.Duration(s.skew.Load())) }}})
	if err != nil {
		t.Fatal(err)
	}
	apiMux := http.NewServeMux()
	apiMux.Handle("/dlqreplay/", http.StripPrefix("/dlqreplay", h))
	srv := httptest.NewServer(apiMux)
	t.Cleanup(srv.Close)
	s.env = &env{url: srv.URL + "/dlqreplay", fake: fake, store: store, db: pool, archive: arc, top: top, h: h}
	return s
}

// deliver runs the local stack's delivery loop on sub (pushing to its
// endpoint as Pub/Sub's push would) until the test ends.
func (s *forwardersStack) deliver(t *testing.T, sub, topic, url string) {
	t.Helper()
	l := &devstack.Loop{Client: s.fake.Client, Project: pubsubtest.Project, BackoffScale: 0.01, Wakeup: s.wake}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		l.Run(ctx, []devstack.Route{{Subscription: sub, Topic: topic, URL: url, Mode: topology.DeliveryPush, MaxAttempts: 5}})
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// publishMessage is version v of aggregate agg as the relay publishes it.
func (s *forwardersStack) publishMessage(t *testing.T, agg string, v int) event.Message {
	t.Helper()
	e := &event.Event{ID: fmt.Sprintf("evt-%s-%d", agg, v), Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
		AggregateID: agg, Version: int64(v), Payload: []byte(`{"orderId":"` + agg + `"}`)}
	if err := e.Prepare(time.Now(), event.Limits{}); err != nil {
		t.Fatal(err)
	}
	m, err := cloudevent.Encode(e, event.EncodingJSON)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// publish publishes versions from..to of aggregate agg on
// shop.order.events, as the relay does (one ordered batch), and returns
// their event ids.
func (s *forwardersStack) publish(t *testing.T, agg string, from, to int) []string {
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
	if n, err := s.fake.Client.PublishBatch(context.Background(), "shop.order.events", msgs); err != nil || n != len(msgs) {
		t.Fatalf("publish: %d of %d: %v", n, len(msgs), err)
	}
	return ids
}

// The done-when: a forward consumer added by API receives the
// next events in order, through the forwarders service's inbox, with its
// subscription (ordered, the topology's retry policy), its registry entry
// and its audit trail; events published before it was added never reach
// it; a change of URL takes effect on the next event; removing it
// deletes its subscription and its registry expectation.
func TestAForwarderAddedByAPIReceivesTheNextEventsInOrder(t *testing.T) {
	ctx := context.Background()
	s := newForwardersStack(t)
	hook := newWebhook(t)

	before := s.publish(t, "order-7", 1, 2) // sent before the forwarder exists

	var added map[string]any
	if code := s.call(t, "POST", "/forwarders", map[string]any{"name": "crm-webhook", "topic": "shop.order.events", "url": hook.url,
		"maxInFlight": 4, "description": "The CRM's webhook."}, &added); code != 200 {
		t.Fatalf("POST /forwarders: %d %v", code, added)
	}
	fv, _ := added["forwarder"].(map[string]any)
	sub := "shop.order.events.crm-webhook-forwarder"
	if fv["subscription"] != sub || fv["revision"] != float64(1) || !strings.HasSuffix(fmt.Sprint(fv["pushEndpoint"]), "/forwarders/crm-webhook") {
		t.Fatalf("added: %v", fv)
	}
	// Its subscription, as a declared push consumer's: ordered, retry
	// policy from the topology, the replay filter, pushing to the
	// forwarders service under its name.
	got, err := s.fake.Client.PubSub().SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{
		Subscription: "projects/" + pubsubtest.Project + "/subscriptions/" + sub})
	if err != nil {
		t.Fatal(err)
	}
	d := s.top.Defaults
	if !got.GetEnableMessageOrdering() || got.GetPushConfig().GetPushEndpoint() != fv["pushEndpoint"] ||
		got.GetRetryPolicy().GetMinimumBackoff().AsDuration() != time.Duration(d.MinBackoffSeconds)*time.Second ||
		got.GetAckDeadlineSeconds() != int32(d.AckDeadlineSeconds) || !strings.Contains(got.GetFilter(), `"crm-webhook"`) {
		t.Fatalf("subscription: %v", got)
	}
	s.deliver(t, sub, "shop.order.events", fmt.Sprint(fv["pushEndpoint"]))

	next := s.publish(t, "order-7", 3, 6)
	if ids := hook.wait(t, len(next)); strings.Join(ids, ",") != strings.Join(next, ",") {
		t.Fatalf("the forwarder received %v, want the events sent after it was added, in order: %v (not %v)", ids, next, before)
	}
	// Through the forwarders service's inbox, under its own name.
	var n int
	if err := s.db.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox WHERE consumer_id = 'crm-webhook'`).Scan(&n); err != nil || n != len(next) {
		t.Fatalf("inbox rows of crm-webhook: %d (%v), want %d", n, err, len(next))
	}
	// The ledger expects it on the topic's new events.
	var list map[string]any
	if code := s.call(t, "GET", "/consumers?topic=shop.order.events", nil, &list); code != 200 {
		t.Fatalf("GET /consumers: %d %v", code, list)
	}
	if !hasConsumer(list, "crm-webhook", true) {
		t.Fatalf("topic_consumers lacks the enabled forwarder: %v", list["consumers"])
	}

	// A new URL reaches the next event.
	hook2 := newWebhook(t)
	var changed map[string]any
	if code := s.call(t, "PATCH", "/forwarders/crm-webhook", map[string]any{"url": hook2.url}, &changed); code != 200 || changed["changed"] != true {
		t.Fatalf("PATCH: %d %v", code, changed)
	}
	later := s.publish(t, "order-7", 7, 7)
	if ids := hook2.wait(t, 1); ids[0] != later[0] {
		t.Fatalf("the new URL received %v, want %v", ids, later)
	}

	// Removed: its subscription is gone (nothing more is delivered) and
	// the ledger no longer waits for it.
	var removed map[string]any
	if code := s.call(t, "DELETE", "/forwarders/crm-webhook", nil, &removed); code != 200 || removed["removed"] != true {
		t.Fatalf("DELETE: %d %v", code, removed)
	}
	if _, err := s.fake.Client.PubSub().SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{
		Subscription: "projects/" + pubsubtest.Project + "/subscriptions/" + sub}); status.Code(err) != codes.NotFound {
		t.Fatalf("the removed forwarder's subscription: %v, want NotFound", err)
	}
	if code := s.call(t, "GET", "/consumers?topic=shop.order.events", nil, &list); code != 200 || !hasConsumer(list, "crm-webhook", false) {
		t.Fatalf("after removal topic_consumers has: %v", list["consumers"])
	}
	// A delivery still in flight for it is acknowledged, not redelivered.
	late := s.publishMessage(t, "order-7", 8)
	resp, err := http.Post(fmt.Sprint(fv["pushEndpoint"]), "application/json",
		bytes.NewReader(delivery.WrappedBody(late, "projects/"+pubsubtest.Project+"/subscriptions/"+sub, 1)))
	if err != nil {
		t.Fatal(err)
	}
	var ack map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&ack)
	resp.Body.Close()
	if resp.StatusCode != 200 || ack["code"] != consume.CodeUnknownForwarder {
		t.Fatalf("a delivery for the removed forwarder: %d %v, want 200 %s", resp.StatusCode, ack, consume.CodeUnknownForwarder)
	}
	var one map[string]any
	if code := s.call(t, "GET", "/forwarders/crm-webhook", nil, &one); code != 404 {
		t.Fatalf("GET a removed forwarder: %d %v", code, one)
	}

	// Every edit is in the audit log, started and succeeded.
	var au map[string]any
	if code := s.call(t, "GET", "/audit?action=forwarder.", nil, &au); code != 200 {
		t.Fatalf("GET /audit: %d %v", code, au)
	}
	seen := map[string]bool{}
	entries, _ := au["entries"].([]any)
	for _, x := range entries {
		m, _ := x.(map[string]any)
		if m["outcome"] == audit.OutcomeSucceeded {
			seen[fmt.Sprint(m["action"])] = true
		}
	}
	for _, a := range []string{audit.ForwarderAdd, audit.ForwarderChange, audit.ForwarderRemove} {
		if !seen[a] {
			t.Errorf("the audit log has no succeeded %s: %v", a, au)
		}
	}
}

// hasConsumer reports whether a GET /consumers answer lists id with that
// enabled state (or, with enabled false, lists it disabled).
func hasConsumer(list map[string]any, id string, enabled bool) bool {
	cs, _ := list["consumers"].([]any)
	for _, x := range cs {
		c, _ := x.(map[string]any)
		if c["consumerId"] == id {
			return c["enabled"] == enabled
		}
	}
	return false
}

// Bad input is refused with 400 naming each field and its rule, and
// nothing is created: a bad URL, an unknown topic, a name a declared
// consumer has, hmac over plain http, limits out of range.
func TestAddingAForwarderValidatesItsFields(t *testing.T) {
	s := newForwardersStack(t)
	ok := map[string]any{"name": "crm-webhook", "topic": "shop.order.events", "url": "https://crm.example.com/hook"}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for kk, vv := range ok {
			m[kk] = vv
		}
		m[k] = v
		return m
	}
	for _, c := range []struct {
		name  string
		body  map[string]any
		field string
		rule  string
	}{
		{"a URL that is not http(s)", with("url", "ftp://crm.example.com/hook"), "url", "absolute http(s) URL"},
		{"a URL with a password", with("url", "https://user:pw@crm.example.com/hook"), "url", "user or password"},
		{"a URL with a token in its query", with("url", "https://crm.example.com/hook?token=x"), "url", "query"},
		{"http with google auth", map[string]any{"name": "crm-webhook", "topic": "shop.order.events", "url": "http://crm.example.com/hook", "auth": "google"}, "url", "https"},
		{"an unknown topic", with("topic", "shop.cart.events"), "topic", "declares no topic shop.cart.events"},
		{"a dead-letter topic", with("topic", "shop.order.events.dlq"), "topic", "a topic is"},
		{"a declared consumer's name", with("name", "member-service"), "name", "infra/topology.yaml declares"},
		{"a bad name", with("name", "CRM_hook"), "name", "a consumer service is"},
		{"hmac over http", map[string]any{"name": "crm-webhook", "topic": "shop.order.events", "url": "http://crm.example.com/hook", "auth": "hmac"}, "url", "https"},
		{"an unknown auth", with("auth", "basic"), "auth", "none, google or hmac"},
		{"too many in flight", with("maxInFlight", 5000), "maxInFlight", "to 1000"},
		{"a negative rate", with("maxPerSecond", -1), "maxPerSecond", "0 (no limit)"},
		{"a timeout past the ack deadline", with("timeoutSeconds", 600), "timeoutSeconds", "ack deadline"},
		{"an unknown field", with("secret", "x"), "secret", "unknown field"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := s.do(t, "POST", "/forwarders", c.body)
			if a.status != 400 || !strings.Contains(a.raw, c.field) || !strings.Contains(a.raw, c.rule) {
				t.Fatalf("%d %s: want 400 naming %s with %q", a.status, a.raw, c.field, c.rule)
			}
		})
	}
	var list map[string]any
	if code := s.call(t, "GET", "/forwarders", nil, &list); code != 200 || len(list["forwarders"].([]any)) != 0 {
		t.Fatalf("after refusals: %d %v", code, list)
	}
	// A name taken twice: 409; its topic and filter cannot change.
	if a := s.do(t, "POST", "/forwarders", ok); a.status != 200 {
		t.Fatalf("add: %d %s", a.status, a.raw)
	}
	if a := s.do(t, "POST", "/forwarders", ok); a.status != 409 {
		t.Fatalf("add twice: %d %s, want 409", a.status, a.raw)
	}
	if a := s.do(t, "PATCH", "/forwarders/crm-webhook", map[string]any{"filter": `attributes.event_type = "order.paid"`}); a.status != 400 || !strings.Contains(a.raw, "filter") {
		t.Fatalf("changing the filter: %d %s, want 400 naming filter", a.status, a.raw)
	}
	if a := s.do(t, "PATCH", "/forwarders/nobody", map[string]any{"url": "https://x.example.com"}); a.status != 404 {
		t.Fatalf("changing an unknown forwarder: %d %s, want 404", a.status, a.raw)
	}
}

// drain publishes what the stack's outbox holds (events and re-pushes)
// with a real relay.
func (s *forwardersStack) drain(t *testing.T) {
	t.Helper()
	drainOutbox(t, s.db, s.fake.Client, s.top)
}

// backfillAForwarderFromAChosenPoint is the backfill tests' common body,
// on either broker: three versions of o-9 published, then crm-webhook
// added (its delivery started, on Pub/Sub, by started), backfilled from a minute ago
// and its backfill driven and published (drain); the target receives the
// three in order, then the next two live ones. It returns the backfill's
// since.
func backfillAForwarderFromAChosenPoint(t *testing.T, e *env, drain func(*testing.T), started func(forwarder map[string]any)) string {
	t.Helper()
	ctx := context.Background()
	hook := newWebhook(t)
	since := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	enqueue := func(from, to int64) []string {
		var evs []*event.Event
		var ids []string
		for v := from; v <= to; v++ {
			id := fmt.Sprintf("o-9-v%d", v)
			evs = append(evs, &event.Event{ID: id, Type: "order.purchased", Source: "order-service",
				Topic: "shop.order.events", AggregateID: "o-9", Version: v, Payload: []byte(`{}`)})
			ids = append(ids, id)
		}
		if _, err := outbox.Enqueue(ctx, e.db, evs...); err != nil {
			t.Fatal(err)
		}
		drain(t)
		return ids
	}
	earlier := enqueue(1, 3)

	a := e.do(t, "POST", "/forwarders", map[string]any{"name": "crm-webhook", "topic": "shop.order.events", "url": hook.url})
	if a.status != 200 {
		t.Fatalf("add: %d %s", a.status, a.raw)
	}
	if started != nil {
		started(a.body["forwarder"].(map[string]any))
	}

	b := e.do(t, "POST", "/backfills", map[string]any{"topic": "shop.order.events", "consumer": "crm-webhook", "since": since, "rate": 1000})
	if b.status != 200 || b.body["matched"] != float64(len(earlier)) {
		t.Fatalf("backfill: %d %s", b.status, b.raw)
	}
	if r := e.do(t, "POST", "/backfills/"+b.body["id"].(string)+":run", nil); r.status != 200 || r.body["state"] != "done" {
		t.Fatalf("run: %d %s", r.status, r.raw)
	}
	drain(t) // the backfill's re-pushes, addressed to the forwarder alone
	if got := hook.wait(t, len(earlier)); strings.Join(got, ",") != strings.Join(earlier, ",") {
		t.Fatalf("backfilled %v, want %v", got, earlier)
	}
	live := enqueue(4, 5)
	if got := hook.wait(t, len(live)); strings.Join(got, ",") != strings.Join(live, ",") {
		t.Fatalf("then live %v, want %v", got, live)
	}
	return since
}

// drainOutbox publishes what db's outbox holds (events and re-pushes) to
// pub with a real relay, in one drain.
func drainOutbox(t *testing.T, db relay.DB, pub relay.Publisher, top *topology.Topology) {
	t.Helper()
	ctx := context.Background()
	r, err := relay.New(relay.Options{DB: db, Publisher: pub, Topology: top, Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	if _, err := r.Drain(ctx, 20*time.Second); err != nil {
		t.Fatal(err)
	}
}

// From a chosen point: a forwarder added after events were published is
// fed them by a backfill from the time the operator chooses (to it alone,
// through the relay), and the next live events follow, in order.
func TestAForwarderIsBackfilledFromAChosenPoint(t *testing.T) {
	s := newForwardersStack(t)
	since := backfillAForwarderFromAChosenPoint(t, s.env, s.drain, func(fv map[string]any) {
		s.deliver(t, fmt.Sprint(fv["subscription"]), "shop.order.events", fmt.Sprint(fv["pushEndpoint"]))
	})
	// A backfill to a name that is no forwarder of the topic is still refused.
	if r := s.do(t, "POST", "/backfills", map[string]any{"topic": "member.points.events", "consumer": "crm-webhook", "since": since}); r.status != 400 {
		t.Fatalf("backfill on another topic: %d %s", r.status, r.raw)
	}
}

// A forwarder removed and added again under its name, with no delivery
// in between, is a new forwarder: its next event goes to its new URL, not
// to the removed one's (both rows are at revision 1; the service tells
// them apart by their creation).
func TestAForwarderRemovedAndAddedAgainServesItsNewSettings(t *testing.T) {
	s := newForwardersStack(t)
	first, second := newWebhook(t), newWebhook(t)
	const sub = "shop.order.events.crm-webhook-forwarder"
	add := func(url string) string {
		t.Helper()
		var added map[string]any
		if code := s.call(t, "POST", "/forwarders", map[string]any{"name": "crm-webhook", "topic": "shop.order.events", "url": url}, &added); code != 200 {
			t.Fatalf("POST /forwarders: %d %v", code, added)
		}
		return fmt.Sprint(added["forwarder"].(map[string]any)["pushEndpoint"])
	}
	s.deliver(t, sub, "shop.order.events", add(first.url))
	one := s.publish(t, "order-8", 1, 1)
	if ids := first.wait(t, 1); ids[0] != one[0] {
		t.Fatalf("the first forwarder received %v, want %v", ids, one)
	}
	var removed map[string]any
	if code := s.call(t, "DELETE", "/forwarders/crm-webhook", nil, &removed); code != 200 {
		t.Fatalf("DELETE: %d %v", code, removed)
	}
	s.deliver(t, sub, "shop.order.events", add(second.url))
	two := s.publish(t, "order-8", 2, 2)
	if ids := second.wait(t, 1); ids[0] != two[0] {
		t.Fatalf("the forwarder added again received %v, want %v", ids, two)
	}
	if n := first.count(); n != 1 {
		t.Errorf("the removed forwarder's URL received %d requests, want only the first event", n)
	}
}
