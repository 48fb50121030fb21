package dlqreplay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	ledgerquery "github.com/relaybus/relaybus/internal/ledger/query"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type env struct {
	url     string
	fake    *pubsubtest.Fake
	store   *ledger.Store
	db      *pgxpool.Pool
	archive *archive.Store
	top     *topology.Topology
	// h is the API's handler (StopJobsAfter, ShiftJobClock).
	h http.Handler
}

func newEnv(t *testing.T, auth, token string) *env {
	t.Helper()
	return newEnvWith(t, func(o *dlqreplay.Options) { o.Auth, o.Token = auth, token })
}

// newEnvWith starts the API over the Firestore emulator, a Postgres schema
// of its own and pstest, with options changed by opt.
func newEnvWith(t *testing.T, opt func(*dlqreplay.Options)) *env {
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
	pool := pgtest.Schema(t)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	fake := pubsubtest.New(t)
	fake.Provision(t, top)
	arc := archive.New(store.Client())
	// The local stack's grants: the anonymous caller is an admin of
	// everything and the DLQ monitors' archiver; no rate limit. Tests of
	// the auth modes and roles set their own.
	o := dlqreplay.Options{Archive: arc, Ledger: store, DB: pool, Publisher: fake.Client, Topology: top,
		Writers: []string{dlqreplay.Anonymous}, Archivers: []string{dlqreplay.Anonymous}, RateLimit: -1}
	opt(&o)
	h, err := dlqreplay.New(o)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/dlqreplay/", http.StripPrefix("/dlqreplay", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &env{url: srv.URL + "/dlqreplay", fake: fake, store: store, db: pool, archive: arc, top: top, h: h}
}

func (e *env) call(t *testing.T, method, path string, body any, out any) int {
	t.Helper()
	var rd bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = *bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, e.url+path, &rd)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// archiveDelivery POSTs m as the DLQ monitor subscription's push delivery.
func (e *env) archiveDelivery(t *testing.T, m event.Message) map[string]any {
	t.Helper()
	body := delivery.WrappedBody(m, "projects/p/subscriptions/shop.order.events.dlq-monitor", 1)
	resp, err := http.Post(e.url+"/deadletters:archive", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != 200 {
		t.Fatalf("archive: %d %v", resp.StatusCode, out)
	}
	return out
}

func orderMessage(id string) event.Message {
	e := &event.Event{ID: id, Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
		AggregateID: "order-1", Version: 1, Payload: []byte(`{"orderId":"order-1"}`)}
	_ = e.Prepare(time.Now(), event.Limits{})
	m, _ := cloudevent.Encode(e, event.EncodingJSON)
	return m
}

func TestArchiveListInspectReplayDelete(t *testing.T) {
	e := newEnv(t, dlqreplay.AuthNone, "")
	poison := deadletter.Poison(event.Message{Data: []byte(`{}`), Attributes: map[string]string{"event_id": "evt-p"}},
		event.ReasonMissingAggregateID, "no aggregate id", "member-service", "shop.order.events.member-service-processor", time.Now())
	poison.ID = "dl-1"
	maxed := deadletter.PubSub(orderMessage("evt-m"), "p", "shop.order.events.message-service-processor", 5)
	maxed.ID = "dl-2"

	if got := e.archiveDelivery(t, poison); got["created"] != true {
		t.Fatalf("first archive: %v", got)
	}
	if got := e.archiveDelivery(t, poison); got["created"] != false {
		t.Fatalf("second archive of the same message: %v, want created false", got)
	}
	e.archiveDelivery(t, maxed)

	var page struct {
		DeadLetters []archive.Letter `json:"deadLetters"`
	}
	if code := e.call(t, "GET", "/deadletters?topic=shop.order.events", nil, &page); code != 200 || len(page.DeadLetters) != 2 {
		t.Fatalf("list: %d %+v", code, page)
	}
	byID := map[string]archive.Letter{}
	for _, l := range page.DeadLetters {
		byID[l.ID] = l
	}
	if l := byID["dl-1"]; l.Reason != event.ReasonMissingAggregateID || l.Consumer != "member-service" || l.EventID != "evt-p" {
		t.Errorf("poison letter %+v", l)
	}
	if l := byID["dl-2"]; l.Reason != deadletter.ReasonMaxDeliveryAttempts || l.Consumer != "message-service" || l.Deliveries != 5 || l.EventID != "evt-m" {
		t.Errorf("max-attempts letter %+v", l)
	}
	if code := e.call(t, "GET", "/deadletters?reason="+deadletter.ReasonMaxDeliveryAttempts, nil, &page); code != 200 || len(page.DeadLetters) != 1 {
		t.Errorf("filter by reason: %d %d letters", code, len(page.DeadLetters))
	}
	var apiErr struct{ Code, Message string }
	if code := e.call(t, "GET", "/deadletters/nope", nil, &apiErr); code != 404 || apiErr.Code != "not_found" {
		t.Errorf("unknown id: %d %+v", code, apiErr)
	}

	// Dry run, then the replay: only message-service's subscription gets it.
	var plan map[string]any
	if code := e.call(t, "POST", "/deadletters/dl-2:replay", map[string]bool{"dryRun": true}, &plan); code != 200 || plan["consumer"] != "message-service" {
		t.Fatalf("dry run: %d %v", code, plan)
	}
	if n := len(e.fake.Server.Messages()); n != 0 {
		t.Fatalf("a dry run published %d messages", n)
	}
	if code := e.call(t, "POST", "/deadletters/dl-2:replay", nil, &plan); code != 200 || plan["messageId"] == "" {
		t.Fatalf("replay: %d %v", code, plan)
	}
	if got := receive(t, e, "shop.order.events.message-service-processor"); len(got) != 1 || got[0].Attributes["event_id"] != "evt-m" ||
		got[0].Attributes[topology.TargetConsumerAttr] != "message-service" || got[0].Attributes[deadletter.AttrSourceSubscription] != "" {
		t.Errorf("message-service received %d: %+v", len(got), got)
	}
	if got := receive(t, e, "shop.order.events.member-service-processor"); len(got) != 0 {
		t.Errorf("member-service received the replay meant for message-service: %+v", got)
	}
	var detail struct {
		Replays []archive.Replay `json:"replays"`
	}
	e.call(t, "GET", "/deadletters/dl-2", nil, &detail)
	if len(detail.Replays) != 1 || detail.Replays[0].By != "anonymous" {
		t.Errorf("replay not recorded: %+v", detail.Replays)
	}

	// Batch replay by filter: the count first, then the replay.
	var batch map[string]any
	if code := e.call(t, "POST", "/deadletters:replay", map[string]any{"reason": event.ReasonMissingAggregateID, "dryRun": true}, &batch); code != 200 || batch["matched"] != float64(1) || batch["replayed"] != nil {
		t.Fatalf("batch dry run: %d %v", code, batch)
	}
	if code := e.call(t, "POST", "/deadletters:replay", map[string]any{"reason": event.ReasonMissingAggregateID}, &batch); code != 200 || batch["replayed"] != float64(1) {
		t.Fatalf("batch replay: %d %v", code, batch)
	}
	if got := receive(t, e, "shop.order.events.member-service-processor"); len(got) != 1 || got[0].Attributes["event_id"] != "evt-p" {
		t.Errorf("member-service received %d after the batch replay", len(got))
	}
	if code := e.call(t, "POST", "/deadletters:replay", map[string]any{}, &apiErr); code != 400 {
		t.Errorf("batch replay without a filter: %d", code)
	}

	// Delete keeps a tombstone; the letter leaves the list and cannot be replayed.
	var tomb archive.Letter
	if code := e.call(t, "DELETE", "/deadletters/dl-1", nil, &tomb); code != 200 || !tomb.Deleted || tomb.DeletedBy != "anonymous" {
		t.Fatalf("delete: %d %+v", code, tomb)
	}
	e.call(t, "GET", "/deadletters", nil, &page)
	if len(page.DeadLetters) != 1 {
		t.Errorf("%d letters listed after a delete, want 1", len(page.DeadLetters))
	}
	if code := e.call(t, "POST", "/deadletters/dl-1:replay", nil, &apiErr); code != 409 || apiErr.Code != "deleted" {
		t.Errorf("replay of a deleted letter: %d %+v", code, apiErr)
	}
}

func receive(t *testing.T, e *env, sub string) []*pubsub.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var (
		mu  sync.Mutex // Receive calls back from several goroutines
		got []*pubsub.Message
	)
	err := e.fake.Client.PubSub().Subscriber(sub).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		mu.Lock()
		got = append(got, m)
		mu.Unlock()
	})
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	return got
}

func TestRepushRules(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, dlqreplay.AuthNone, "")
	now := time.Now().UTC()
	mk := func(id string, expire time.Time) *event.Event {
		ev := &event.Event{ID: id, Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
			AggregateID: id, Version: 1, Payload: []byte(`{"orderId":"x"}`), ExpireAt: expire}
		_ = ev.Prepare(now, event.Limits{})
		return ev
	}
	failed, recent, expired := mk("evt-failed", time.Time{}), mk("evt-recent", time.Time{}), mk("evt-expired", now.Add(-time.Minute))
	if err := e.store.RecordPublishFailure(ctx, failed, 5, "permission denied", true, now); err != nil {
		t.Fatal(err)
	}
	if err := e.store.RecordSent(ctx, model.SentAt(now, recent, expired)); err != nil {
		t.Fatal(err)
	}
	var res map[string]any
	if code := e.call(t, "POST", "/events/evt-failed:repush", map[string]string{"consumer": "member-service"}, &res); code != 200 || res["status"] != "RETRYING" {
		t.Fatalf("re-push of a FAILED event: %d %v", code, res)
	}
	got, err := outbox.Lookup(ctx, e.db, "evt-failed")
	if err != nil || got["evt-failed"].State != outbox.StatePending {
		t.Fatalf("the re-push is not queued in the outbox: %+v %v", got, err)
	}
	if target := got["evt-failed"].Target; target != "member-service" {
		t.Errorf("re-push addressed to %q", target)
	}
	var apiErr struct{ Code, Message string }
	for _, c := range []struct{ id, code string }{
		{"evt-recent", "too_recent"}, {"evt-expired", "expired"},
	} {
		if status := e.call(t, "POST", "/events/"+c.id+":repush", nil, &apiErr); status != 409 || apiErr.Code != c.code || apiErr.Message == "" {
			t.Errorf("%s: %d %+v, want 409 %s", c.id, status, apiErr, c.code)
		}
	}
	// Past the maximum re-push count.
	for range 2 {
		e.call(t, "POST", "/events/evt-failed:repush", nil, nil)
	}
	if status := e.call(t, "POST", "/events/evt-failed:repush", nil, &apiErr); status != 409 || apiErr.Code != "max_repushes" {
		t.Errorf("fourth re-push: %d %+v, want 409 max_repushes", status, apiErr)
	}
	if status := e.call(t, "POST", "/events/nope:repush", nil, &apiErr); status != 404 {
		t.Errorf("unknown event: %d", status)
	}
	var d ledgerquery.Detail
	if status := e.call(t, "GET", "/events/evt-failed", nil, &d); status != 200 || d.Event.RetryCount != 3 {
		t.Errorf("GET /events: %d retryCount %d", status, d.Event.RetryCount)
	}
}
