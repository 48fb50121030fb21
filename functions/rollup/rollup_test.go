package rollup

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"

	"github.com/relaybus/relaybus/internal/instance"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
)

func TestMain(m *testing.M) {
	code := m.Run()
	emutest.Cleanup()
	os.Exit(code)
}

const (
	topic = "shop.order.events"
	sub   = "projects/p/subscriptions/relaybus.ledger.rollup.rollup-processor"
)

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type env struct {
	store *ledger.Store
	url   string // the rollup function's URL in the local stack
	logs  *syncBuffer
}

// start serves the function the way the local stack does: mounted under
// /rollup with http.StripPrefix, over real HTTP.
func start(t *testing.T) *env {
	t.Helper()
	project := emutest.FirestoreProject(t)
	c, err := firestore.NewClientWithDatabase(context.Background(), project, ledger.DefaultDatabase)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	store := ledger.New(c, ledger.Options{})
	if _, err := consumers.New(store.Client(), consumers.Options{}).SyncConsumers(context.Background(), []registry.Consumer{
		{Topic: topic, ConsumerID: "member-service", Enabled: true, SortOrder: 1},
		{Topic: topic, ConsumerID: "message-service", Enabled: true, SortOrder: 2},
	}, consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	h, err := New(context.Background(), Deps{Ledger: store, Logger: logging.New(logs, logging.Options{Level: slog.LevelDebug}),
		NotFoundWait: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/rollup/", http.StripPrefix("/rollup", h))
	mux.Handle("/rollup", http.StripPrefix("/rollup", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &env{store: store, url: srv.URL + "/rollup", logs: logs}
}

func newEvent(t *testing.T) *event.Event {
	t.Helper()
	e := &event.Event{Type: "order.purchased", Topic: topic, AggregateID: "ORD-1", Version: 1, Payload: []byte(`{}`),
		Initiator: event.Initiator{Service: "order-service"}}
	if err := e.Prepare(time.Now(), event.Limits{}); err != nil {
		t.Fatal(err)
	}
	return e
}

// notice is a rollup notice as Pub/Sub hands it over.
func notice(eventID string) event.Message {
	m := model.RollupMessage(eventID)
	m.ID = "msg-" + eventID
	m.PublishTime = time.Now()
	return m
}

type answer struct {
	code int
	body noticeAnswer
}

func do(t *testing.T, req *http.Request) answer {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var a noticeAnswer
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("%d %s: %v", resp.StatusCode, b, err)
	}
	return answer{resp.StatusCode, a}
}

// The three request shapes Google sends: wrapped push, unwrapped push
// (write-metadata) and Eventarc's binary-mode CloudEvent.
func requests(t *testing.T, url string, m event.Message) map[string]*http.Request {
	t.Helper()
	wrapped, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(delivery.WrappedBody(m, sub, 1)))
	if err != nil {
		t.Fatal(err)
	}
	wrapped.Header.Set("Content-Type", "application/json")
	unwrapped, err := delivery.UnwrappedRequest(url, sub, m, 2)
	if err != nil {
		t.Fatal(err)
	}
	eventarc, err := delivery.EventarcRequest(url, "p", ledger.DefaultRollupTopic, sub, m)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]*http.Request{"push": wrapped, "push-unwrapped": unwrapped, "eventarc": eventarc}
}

func TestRollupOverHTTP(t *testing.T) {
	ctx := context.Background()
	env := start(t)
	e := newEvent(t)

	// Before the relay recorded the send: looked for again, then
	// acknowledged as pending (the reconciler rolls it up once the send is
	// recorded), for every delivery shape.
	for mode, req := range requests(t, env.url, notice(e.ID)) {
		if a := do(t, req); a.code != http.StatusOK || a.body.EventID != e.ID || !a.body.Pending {
			t.Errorf("%s before the send: %d %+v, want 200 pending", mode, a.code, a.body)
		}
	}
	if err := env.store.RecordSent(ctx, model.SentAt(time.Now(), e)); err != nil {
		t.Fatal(err)
	}
	record := func(c string, n int, o model.Outcome) {
		if _, err := env.store.InsertAttempt(ctx, model.Attempt{EventID: e.ID, ConsumerID: c, AttemptNo: n, Success: o == model.OutcomeSuccess, Outcome: o}); err != nil {
			t.Fatal(err)
		}
	}
	record("member-service", 1, model.OutcomeSuccess)
	record("message-service", 1, model.OutcomeRetry)
	reqs := requests(t, env.url, notice(e.ID))
	if a := do(t, reqs["push"]); a.code != http.StatusOK || a.body.Status != model.StatusPartial || !a.body.Changed || a.body.Previous != model.StatusSent {
		t.Errorf("push: %d %+v", a.code, a.body)
	}
	if a := do(t, reqs["eventarc"]); a.code != http.StatusOK || a.body.Status != model.StatusPartial || a.body.Changed {
		t.Errorf("eventarc, same state again: %d %+v", a.code, a.body)
	}
	record("message-service", 2, model.OutcomeSuccess)
	if a := do(t, reqs["push-unwrapped"]); a.code != http.StatusOK || a.body.Status != model.StatusConsumed || !a.body.Changed {
		t.Errorf("unwrapped push: %d %+v", a.code, a.body)
	}
	if got, _ := query.New(env.store.Client()).Get(ctx, e.ID); got.Event.Status != model.StatusConsumed {
		t.Errorf("ledger says %s", got.Event.Status)
	}
	// The status change is logged with the event's fields.
	var changed map[string]any
	for _, line := range strings.Split(env.logs.String(), "\n") {
		if strings.Contains(line, `"rollup: status changed"`) && strings.Contains(line, `"CONSUMED"`) {
			_ = json.Unmarshal([]byte(line), &changed)
		}
	}
	if changed["event_id"] != e.ID || changed["event_type"] != "order.purchased" || changed["aggregate_id"] != "ORD-1" ||
		changed["previous_status"] != "PARTIAL" || changed["severity"] != "INFO" || changed["delivery_mode"] != "push-unwrapped" {
		t.Errorf("status change log line: %v\nlogs:\n%s", changed, env.logs)
	}
}

func TestMalformedNoticesAreAcknowledged(t *testing.T) {
	env := start(t)
	post := func(body, contentType string) *http.Request {
		req, _ := http.NewRequest(http.MethodPost, env.url+"/", strings.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		return req
	}
	noID := event.Message{ID: "m1", Data: []byte(`{"hello":"world"}`), Attributes: map[string]string{}}
	badID := notice("a/b")
	for name, req := range map[string]*http.Request{
		"not json":         post("{{{", "application/json"),
		"empty body":       post("", "application/json"),
		"no event id":      requests(t, env.url, noID)["push"],
		"invalid event id": requests(t, env.url, badID)["eventarc"],
	} {
		a := do(t, req)
		if a.code != http.StatusOK || a.body.Error == "" {
			t.Errorf("%s: %d %+v, want 200 (acknowledged) with the error", name, a.code, a.body)
		}
	}
	errorLines := strings.Count(env.logs.String(), `"severity":"ERROR"`)
	if errorLines != 4 {
		t.Errorf("%d ERROR log lines for 4 malformed notices:\n%s", errorLines, env.logs)
	}
	resp, err := http.Get(env.url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", resp.StatusCode)
	}
}

func TestExpireEndpoint(t *testing.T) {
	ctx := context.Background()
	env := start(t)
	e := newEvent(t)
	e.ExpireAt = e.OccurredAt.Add(time.Millisecond)
	if err := env.store.RecordSent(ctx, model.SentAt(time.Now(), e)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	resp, err := http.Post(env.url+"/expire", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	var a expireAnswer
	_ = json.NewDecoder(resp.Body).Decode(&a)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || a.Due != 1 || a.Expired != 1 {
		t.Errorf("/expire: %d %+v", resp.StatusCode, a)
	}
	if got, _ := query.New(env.store.Client()).Get(ctx, e.ID); got.Event.Status != model.StatusExpired {
		t.Errorf("status %s", got.Event.Status)
	}
	resp, _ = http.Post(env.url+"/expire?limit=0", "application/json", nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("limit=0: %d", resp.StatusCode)
	}
}

// The registered function builds itself from the environment.
func TestServeFromEnvironment(t *testing.T) {
	project := emutest.FirestoreProject(t)
	t.Setenv("GOOGLE_CLOUD_PROJECT", project)
	t.Setenv("FIRESTORE_DATABASE", "(default)")
	srv := httptest.NewServer(instance.Lazy("rollup", instance.FromEnv(instance.Load[Config], Build)))
	defer srv.Close()
	req := requests(t, srv.URL, notice("unknown-event"))["push"]
	if a := do(t, req); a.code != http.StatusOK || !a.body.Pending {
		t.Errorf("unknown event through the env-built function: %d %+v", a.code, a.body)
	}
}

var _ Ledger = (*ledger.Store)(nil)

// Notices that arrive together are rolled up together: one notice naming
// several events, and several notices at once, each answered with its own
// events.
func TestNoticesAreRolledUpTogether(t *testing.T) {
	ctx := context.Background()
	env := start(t)
	var ids []string
	for i := range 6 {
		e := newEvent(t)
		e.AggregateID = "ORD-" + strconv.Itoa(i)
		if err := env.store.RecordSent(ctx, model.SentAt(time.Now(), e)); err != nil {
			t.Fatal(err)
		}
		for _, c := range []string{"member-service", "message-service"} {
			if _, err := env.store.InsertAttempt(ctx, model.Attempt{EventID: e.ID, ConsumerID: c, AttemptNo: 1, Success: true, Outcome: model.OutcomeSuccess}); err != nil {
				t.Fatal(err)
			}
		}
		ids = append(ids, e.ID)
	}
	batch := model.RollupMessage(ids[:3]...)
	batch.ID = "msg-batch"
	var wg sync.WaitGroup
	answers := make([]answer, 4)
	msgs := []event.Message{batch, notice(ids[3]), notice(ids[4]), notice(ids[5])}
	for i, m := range msgs {
		wg.Add(1)
		go func() { defer wg.Done(); answers[i] = do(t, requests(t, env.url, m)["push"]) }()
	}
	wg.Wait()
	if a := answers[0]; a.code != http.StatusOK || len(a.body.Events) != 3 {
		t.Fatalf("batch notice: %d %+v", a.code, a.body)
	}
	for i, a := range answers {
		for _, ea := range a.body.Events {
			if ea.Status != model.StatusConsumed || !ea.Changed {
				t.Errorf("notice %d: %+v, want CONSUMED, changed", i, ea)
			}
		}
	}
}

// A notice that never arrives: the reconciler, on its schedule, derives the
// status anyway.
func TestReconcileEndpointRollsUpWhatNoNoticeNamed(t *testing.T) {
	ctx := context.Background()
	project := emutest.FirestoreProject(t)
	c, err := firestore.NewClientWithDatabase(ctx, project, ledger.DefaultDatabase)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	now := time.Now().UTC()
	store := ledger.New(c, ledger.Options{Now: func() time.Time { return now }})
	if _, err := consumers.New(store.Client(), consumers.Options{}).SyncConsumers(ctx, []registry.Consumer{{Topic: topic, ConsumerID: "member-service", Enabled: true}}, consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	h, err := New(ctx, Deps{Ledger: store})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	e := newEvent(t)
	if err := store.RecordSent(ctx, model.SentAt(now, e)); err != nil {
		t.Fatal(err)
	}
	if _, err := store.InsertAttempt(ctx, model.Attempt{EventID: e.ID, ConsumerID: "member-service", AttemptNo: 1, Success: true, Outcome: model.OutcomeSuccess}); err != nil {
		t.Fatal(err)
	}
	// The notice is dropped on purpose. A minute later the reconciler runs.
	now = now.Add(ledger.DefaultReconcileAfter + time.Second)
	resp, err := http.Post(srv.URL+"/reconcile", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	var rep reconcileAnswer
	_ = json.NewDecoder(resp.Body).Decode(&rep)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || rep.Due != 1 || rep.Changed != 1 || rep.Settled != 1 {
		t.Fatalf("/reconcile: %d %+v", resp.StatusCode, rep)
	}
	if d, _ := query.New(store.Client()).Get(ctx, e.ID); d.Event.Status != model.StatusConsumed {
		t.Errorf("status %s, want CONSUMED", d.Event.Status)
	}
	resp, _ = http.Post(srv.URL+"/reconcile?limit=abc", "application/json", nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("limit=abc: %d", resp.StatusCode)
	}
}

// A notice that carries its attempts (ledger.FoldMessage) is their only
// way into the ledger, and it does not wait for the event's send: an event
// not in the ledger yet gets its document from the notice, with every
// consumer's outcome folded in (CONSUMED at once, 200), and the send,
// recorded after, adds the envelope; no attempt document is written for a
// first attempt that succeeded.
func TestFoldNoticeOverHTTP(t *testing.T) {
	ctx := context.Background()
	env := start(t)
	e := newEvent(t)
	at := time.Now().UTC()
	as := []model.Attempt{
		{EventID: e.ID, ConsumerID: "member-service", AttemptNo: 1, Success: true, Outcome: model.OutcomeSuccess, ConsumedAt: at, MessageID: "m-1", Topic: topic},
		{EventID: e.ID, ConsumerID: "message-service", AttemptNo: 1, Success: true, Outcome: model.OutcomeSuccess, ConsumedAt: at, MessageID: "m-1", Topic: topic},
	}
	m := model.FoldMessage(as)
	m.ID, m.PublishTime = "fold-"+e.ID, time.Now()
	if a := do(t, requests(t, env.url, m)["push"]); a.code != http.StatusOK || a.body.Status != model.StatusConsumed || !a.body.Changed || a.body.Pending {
		t.Fatalf("before the send: %d %+v, want 200 CONSUMED", a.code, a.body)
	}
	sentAt := time.Now().UTC().Truncate(time.Microsecond) // Firestore keeps microseconds
	if err := env.store.RecordSent(ctx, model.SentAt(sentAt, e)); err != nil {
		t.Fatal(err)
	}
	if a := do(t, requests(t, env.url, m)["eventarc"]); a.code != http.StatusOK || a.body.Status != model.StatusConsumed || a.body.Changed {
		t.Fatalf("redelivered after the send: %d %+v, want 200 CONSUMED, unchanged", a.code, a.body)
	}
	d, err := query.New(env.store.Client()).Get(ctx, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d.Summary() != "2/2 consumed" || len(d.Consumers) != 2 || len(d.Consumers[0].Attempts) != 1 || d.Consumers[0].Attempts[0].MessageID != "m-1" {
		t.Fatalf("detail %s %+v", d.Summary(), d.Consumers)
	}
	if d.Event.Status != model.StatusConsumed || d.Event.EventType != e.Type || !d.Event.SentAt.Equal(sentAt) || string(d.Event.Payload) != string(e.Payload) {
		t.Fatalf("after the send: %s type %q sentAt %v payload %q, want CONSUMED with the envelope and the send", d.Event.Status, d.Event.EventType, d.Event.SentAt, d.Event.Payload)
	}
	docs, err := env.store.Client().Collection(model.CollectionEvents).Doc(model.EventDocID(e.ID)).Collection(model.CollectionConsumptions).Documents(ctx).GetAll()
	if err != nil || len(docs) != 0 {
		t.Fatalf("%d attempt documents (%v), want none: first-attempt successes live in the event's document", len(docs), err)
	}
	// A notice redelivered once more changes nothing.
	if a := do(t, requests(t, env.url, m)["push-unwrapped"]); a.code != http.StatusOK || a.body.Status != model.StatusConsumed || a.body.Changed {
		t.Fatalf("again: %d %+v", a.code, a.body)
	}
}

// TestSendsNoticeOverHTTP: a consumer's kicks of its child events reach
// the ledger as sends notices (a consumer's identity may not write
// Firestore): the rollup records each send with its envelope, a payload
// too large for the ledger as its size alone, and a redelivered notice
// changes nothing.
func TestSendsNoticeOverHTTP(t *testing.T) {
	ctx := context.Background()
	env := start(t)
	child, big := newEvent(t), newEvent(t)
	child.ParentEventID, child.TraceID = "evt-parent", "trace-1"
	big.Payload = []byte(`"` + strings.Repeat("x", model.DefaultMaxStoredPayload+10) + `"`)
	at := time.Now().UTC().Truncate(time.Microsecond)
	msgs, err := model.SendsMessages([]model.Sent{{Event: child, At: at, EnqueuedAt: at}, {Event: big, At: at, EnqueuedAt: at}})
	if err != nil || len(msgs) != 1 || len(msgs[0].Data) > 4096 {
		t.Fatalf("%d notices (%v), the first %d bytes: want one, small (the large payload left out)", len(msgs), err, len(msgs[0].Data))
	}
	m := msgs[0]
	m.ID, m.PublishTime = "sends-1", time.Now()
	for _, shape := range []string{"push", "eventarc"} {
		if a := do(t, requests(t, env.url, m)[shape]); a.code != http.StatusOK || a.body.Error != "" {
			t.Fatalf("%s: %d %+v", shape, a.code, a.body)
		}
	}
	d, err := query.New(env.store.Client()).Get(ctx, child.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d.Event.Status != model.StatusSent || d.Event.ParentEventID != "evt-parent" || d.Event.TraceID != "trace-1" || !d.Event.SentAt.Equal(at) || string(d.Event.Payload) != "{}" {
		t.Errorf("the child: %+v", d.Event)
	}
	b, err := query.New(env.store.Client()).Get(ctx, big.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !b.Event.PayloadOmitted || b.Event.PayloadSize != len(big.Payload) || len(b.Event.Payload) != 0 {
		t.Errorf("the large one: omitted %v size %d stored %d, want omitted, its size", b.Event.PayloadOmitted, b.Event.PayloadSize, len(b.Event.Payload))
	}
	bad := event.Message{Data: []byte(`{"sends": [{"e": null}]}`), Attributes: map[string]string{model.NoticeKindAttr: model.NoticeSends}, ID: "sends-bad", PublishTime: time.Now()}
	if a := do(t, requests(t, env.url, bad)["push"]); a.code != http.StatusOK || !strings.Contains(a.body.Error, "send 0 has no event") {
		t.Errorf("a malformed sends notice: %d %+v, want it acknowledged and said", a.code, a.body)
	}
}
