package dlqreplay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/projection"
)

// strictDeliveries hands versions of user u-42's notifications to the
// repository topology's strict consumer (audit-service on
// message.notification.events) with its real resequencer over e's database,
// and returns the resequencer and the engine (the consumer's Runner).
func strictDeliveries(t *testing.T, e *env, versions ...int64) (*projection.Resequencer, *consumer.Engine) {
	t.Helper()
	ctx := context.Background()
	if err := inbox.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	if err := projection.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	rs := projection.NewStrict(projection.Latest(), projection.StrictOptions{})
	eng, err := consumer.New(consumer.Options{DB: e.db, ConsumerID: "audit-service",
		Subscription: "message.notification.events.audit-service-recorder", Handler: rs, DeadLetters: e.fake.Client})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range versions {
		ev := &event.Event{ID: fmt.Sprintf("evt-n-%d", v), Type: "notification.sent", Source: "message-service",
			Topic: "message.notification.events", AggregateType: "user", AggregateID: "u-42", Version: v, Payload: []byte(`{"n":1}`)}
		if err := ev.Prepare(time.Now(), event.Limits{}); err != nil {
			t.Fatal(err)
		}
		m, err := event.Encode(ev, event.EncodingJSON)
		if err != nil {
			t.Fatal(err)
		}
		m.ID = fmt.Sprintf("m-%d", v)
		res := eng.Handle(ctx, delivery.Delivery{Mode: delivery.ModePush, Subscription: "projects/p/subscriptions/message.notification.events.audit-service-recorder", Message: m})
		if res.Status != http.StatusOK {
			t.Fatalf("deliver v%d: %+v", v, res)
		}
	}
	return rs, eng
}

// A strict consumer's gaps are listed and released through the operators'
// API (the consume service is internal-only: operators cannot reach its
// /gaps), from the consumer's own database; the skip is audited, a reader
// may list but not skip, read-only mode refuses it, and the parked version
// is applied by the consumer's own check afterwards.
func TestGapsThroughTheOperatorsAPI(t *testing.T) {
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		behindCloudRun(o)
	})
	rs, eng := strictDeliveries(t, e, 1, 3, 4)
	base := "/consumers/message.notification.events/audit-service"
	alice, bob := bearerOf(person("alice@example.com")), bearerOf(person("bob@example.com"))

	runAuth(t, e, []authCase{
		{name: "a reader lists", path: base + "/gaps", headers: bob, want: 200},
		{name: "a reader may not skip", method: "POST", path: base + "/gaps:skip", headers: bob,
			body: map[string]any{"aggregateId": "u-42", "version": 2}, want: 403, code: "forbidden"},
		{name: "not strict", path: "/consumers/shop.order.events/member-service/gaps", headers: bob, want: 404, code: "no_gaps"},
		{name: "not declared", path: "/consumers/shop.order.events/nobody/gaps", headers: bob, want: 404, code: "not_found"},
		{name: "bad parameter", path: base + "/gaps?aggregateId=a%20b", headers: bob, want: 400, code: "invalid_argument"},
		{name: "unknown parameter", path: base + "/gaps?x=1", headers: bob, want: 400, code: "invalid_argument"},
		{name: "not the first missing version", method: "POST", path: base + "/gaps:skip", headers: alice,
			body: map[string]any{"aggregateId": "u-42", "version": 3}, want: 409, code: "not_missing"},
		{name: "through a parked version", method: "POST", path: base + "/gaps:skip", headers: alice,
			body: map[string]any{"aggregateId": "u-42", "version": 2, "through": 3}, want: 409, code: "parked"},
		{name: "no version", method: "POST", path: base + "/gaps:skip", headers: alice,
			body: map[string]any{"aggregateId": "u-42"}, want: 400, code: "invalid_argument"},
	})

	var list struct {
		Gaps []projection.Gap
	}
	if code := e.callWith(t, "GET", base+"/gaps", bob, nil, &list); code != 200 {
		t.Fatalf("gaps: %d", code)
	}
	if len(list.Gaps) != 1 || list.Gaps[0].AggregateID != "u-42" || list.Gaps[0].Missing != 2 || list.Gaps[0].FirstParked != 3 || list.Gaps[0].Parked != 2 {
		t.Fatalf("gaps %+v, want u-42 missing 2, versions 3 and 4 parked", list.Gaps)
	}

	var skip map[string]any
	if code := e.callWith(t, "POST", base+"/gaps:skip", alice, map[string]any{"aggregateId": "u-42", "version": 2, "reason": "never published (INC-1)"}, &skip); code != 200 {
		t.Fatalf("skip: %d %v", code, skip)
	}
	if fmt.Sprint(skip["skipped"]) != "[2]" || skip["aggregateType"] != "user" {
		t.Fatalf("skip answered %v", skip)
	}
	entries, err := e.store.Audit().List(context.Background(), audit.Query{ActionPrefix: "gaps.", Outcome: audit.OutcomeSucceeded, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].By != "alice@example.com" || entries[0].ConsumerID != "audit-service" {
		t.Fatalf("audit %+v, want one gaps.skip by alice", entries)
	}

	// The consumer's own check (its Scheduler job) applies 3 and 4.
	rep, err := rs.Check(context.Background(), eng)
	if err != nil {
		t.Fatal(err)
	}
	gaps, err := rs.Gaps(context.Background(), eng, projection.GapFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var pos int64
	if err := e.db.QueryRow(context.Background(), `SELECT version FROM relaybus_strict_position WHERE consumer_id = 'audit-service' AND aggregate_id = 'u-42'`).Scan(&pos); err != nil {
		t.Fatal(err)
	}
	if len(gaps) != 0 || pos != 4 {
		t.Fatalf("after the check (%+v): gaps %+v, position %d; want none and 4", rep, gaps, pos)
	}

	ro := newHandler(t, e, func(o *dlqreplay.Options) { o.ReadOnly = true })
	runAuth(t, ro, []authCase{
		{name: "read-only refuses a skip", method: "POST", path: base + "/gaps:skip", body: map[string]any{"aggregateId": "u-42", "version": 5}, want: 403, code: "read_only"},
		{name: "read-only lists", path: base + "/gaps", want: 200},
	})
}

// callWith is env.call with request headers.
func (e *env) callWith(t *testing.T, method, path string, headers map[string]string, body any, out any) int {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, e.url+path, rd)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
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
