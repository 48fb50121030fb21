package dlqreplay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/ledger/consumers"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/projection"
)

// answer is a decoded API answer.
type answer struct {
	status int
	ctype  string
	body   map[string]any
	raw    string
}

func (e *env) do(t *testing.T, method, path string, body any) answer {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), raw: string(raw)}
	_ = json.Unmarshal(raw, &a.body)
	return a
}

// fields returns the fields a 400 answer names.
func (a answer) fields() []string {
	var out []string
	fs, _ := a.body["fields"].([]any)
	for _, f := range fs {
		if m, ok := f.(map[string]any); ok {
			out = append(out, m["field"].(string))
		}
	}
	return out
}

// Every parameter's bounds: each hostile value is a 400 that names its
// field, before anything else happens; unknown routes are JSON 404s.
func TestParameterBounds(t *testing.T) {
	e := newEnv(t, dlqreplay.AuthNone, "")
	long := strings.Repeat("a", 5000)
	esc := url.QueryEscape
	type tc struct {
		method, path string
		body         any
		status       int
		field        string // the field the 400 names ("" for other statuses)
	}
	cases := []tc{
		// GET /events: every filter and the paging.
		{"GET", "/events?traceId=" + long, nil, 400, "traceId"},
		{"GET", "/events?traceId=" + esc("a b"), nil, 400, "traceId"},
		{"GET", "/events?topic=" + long, nil, 400, "topic"},
		{"GET", "/events?topic=Shop.Orders", nil, 400, "topic"},
		{"GET", "/events?topic=shop.order.events.dlq", nil, 400, "topic"},
		{"GET", "/events?service=" + long, nil, 400, "service"},
		{"GET", "/events?service=" + esc("web app"), nil, 400, "service"},
		{"GET", "/events?eventType=" + esc("order purchased"), nil, 400, "eventType"},
		{"GET", "/events?eventType=" + long, nil, 400, "eventType"},
		{"GET", "/events?aggregateId=" + esc("a/b"), nil, 400, "aggregateId"},
		{"GET", "/events?aggregateId=" + long, nil, 400, "aggregateId"},
		{"GET", "/events?status=DONE", nil, 400, "status"},
		{"GET", "/events?status=" + long, nil, 400, "status"},
		{"GET", "/events?pageSize=abc", nil, 400, "pageSize"},
		{"GET", "/events?pageSize=0", nil, 400, "pageSize"},
		{"GET", "/events?pageSize=-1", nil, 400, "pageSize"},
		{"GET", "/events?pageSize=501", nil, 400, "pageSize"},
		{"GET", "/events?pageSize=100000000", nil, 400, "pageSize"},
		{"GET", "/events?pageSize=99999999999999999999", nil, 400, "pageSize"},
		{"GET", "/events?pageToken=" + esc("!!"), nil, 400, "pageToken"},
		{"GET", "/events?pageToken=" + strings.Repeat("a", 1025), nil, 400, "pageToken"},
		{"GET", "/events?pageToken=abcdef", nil, 400, "pageToken"},
		{"GET", "/events?from=yesterday", nil, 400, "from"},
		{"GET", "/events?from=1999-12-31T23:59:59Z", nil, 400, "from"},
		{"GET", "/events?to=2100-01-01T00:00:00Z", nil, 400, "to"},
		{"GET", "/events?from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z", nil, 400, "to"},
		{"GET", "/events?foo=1", nil, 400, "foo"},
		{"GET", "/events?topic=shop.order.events&topic=member.points.events", nil, 400, "topic"},
		{"GET", "/events?pageSize=1", nil, 200, ""},
		{"GET", "/events?pageSize=500&status=sent&topic=shop.order.events&eventType=order.purchased&aggregateId=order-1&from=2026-01-01T00:00:00Z", nil, 200, ""},
		// One event, one trace.
		{"GET", "/events/" + strings.Repeat("e", 129), nil, 400, "id"},
		{"GET", "/events/" + esc("a b"), nil, 400, "id"},
		{"GET", "/events/evt-1?x=1", nil, 400, "x"},
		{"GET", "/events/no-such-event", nil, 404, ""},
		{"GET", "/traces/" + long, nil, 400, "id"},
		{"POST", "/events/evt-1:repush", map[string]any{"consumer": "Member Service"}, 400, "consumer"},
		{"POST", "/events/evt-1:repush", map[string]any{"dryRun": "yes"}, 400, "dryRun"},
		{"POST", "/events/evt-1:repush", map[string]any{"target": "x"}, 400, "target"},
		{"POST", "/events/evt-1:repush", "{", 400, "body"},
		{"POST", "/events/evt-1:repush", `{"consumer":"a"} {"consumer":"b"}`, 400, "body"},
		// Dead letters.
		{"GET", "/deadletters?pageSize=501", nil, 400, "pageSize"},
		{"GET", "/deadletters?pageSize=x", nil, 400, "pageSize"},
		{"GET", "/deadletters?pageToken=" + esc("a/b"), nil, 400, "pageToken"},
		{"GET", "/deadletters?pageToken=no-such-letter", nil, 400, "pageToken"},
		{"GET", "/deadletters?reason=Max+Attempts", nil, 400, "reason"},
		{"GET", "/deadletters?reason=" + long, nil, 400, "reason"},
		{"GET", "/deadletters?consumer=Member_Service", nil, 400, "consumer"},
		{"GET", "/deadletters?topic=" + long, nil, 400, "topic"},
		{"GET", "/deadletters?eventId=" + esc("a b"), nil, 400, "eventId"},
		{"GET", "/deadletters?since=now", nil, 400, "since"},
		{"GET", "/deadletters?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z", nil, 400, "until"},
		{"GET", "/deadletters?deleted=maybe", nil, 400, "deleted"},
		{"GET", "/deadletters?deleted=true&pageSize=500", nil, 200, ""},
		{"GET", "/deadletters/" + strings.Repeat("d", 257), nil, 400, "id"},
		{"GET", "/deadletters/no-such-letter", nil, 404, ""},
		{"POST", "/deadletters/dl-x:replay", map[string]any{"dryRun": 1}, 400, "dryRun"},
		{"POST", "/deadletters/dl-x:replay", map[string]any{"consumer": "x"}, 400, "consumer"},
		{"POST", "/deadletters/dl-x:replay?dryRun=yes", nil, 400, "dryRun"},
		{"POST", "/deadletters:replay", map[string]any{}, 400, "topic"},
		{"POST", "/deadletters:replay", "", 400, "body"},
		{"POST", "/deadletters:replay", map[string]any{"topic": "Bad"}, 400, "topic"},
		{"POST", "/deadletters:replay", map[string]any{"reason": "x", "since": "soon"}, 400, "since"},
		{"POST", "/deadletters:replay", map[string]any{"reason": "x", "expect": -1}, 400, "expect"},
		{"POST", "/deadletters:replay", map[string]any{"reason": "x", "expect": "all"}, 400, "expect"},
		{"POST", "/deadletters:replay", map[string]any{"reason": "x", "dryRun": true, "extra": 1}, 400, "extra"},
		{"POST", "/deadletters:replay", `{"reason": "` + strings.Repeat("x", 70000) + `"}`, 413, ""},
		{"DELETE", "/deadletters/" + esc("a b"), nil, 400, "id"},
		// Seek and snapshots: validated before "not configured" (no Seeker here).
		{"POST", "/subscriptions/not-a-subscription:seek", map[string]any{"time": "2026-01-01T00:00:00Z"}, 400, "subscription"},
		{"POST", "/subscriptions/shop.order.events.nobody-processor:seek", map[string]any{"time": "2026-01-01T00:00:00Z"}, 400, "subscription"},
		{"POST", "/subscriptions/shop.order.events.member-service-processor:seek", "{", 400, "body"},
		{"POST", "/subscriptions/shop.order.events.member-service-processor:seek", map[string]any{"time": "x"}, 400, "time"},
		{"POST", "/subscriptions/shop.order.events.member-service-processor:seek", map[string]any{"snapshot": "1bad"}, 400, "snapshot"},
		{"POST", "/subscriptions/shop.order.events.member-service-processor:seek", map[string]any{}, 400, "time"},
		{"POST", "/subscriptions/shop.order.events.member-service-processor:seek", map[string]any{"time": "2026-01-01T00:00:00Z"}, 501, ""},
		{"POST", "/subscriptions/" + long + ":seek", map[string]any{"time": "2026-01-01T00:00:00Z"}, 400, "subscription"},
		{"POST", "/snapshots", map[string]any{"name": "goog-x", "subscription": "shop.order.events.member-service-processor"}, 400, "name"},
		{"POST", "/snapshots", map[string]any{"name": "before", "subscription": "nope"}, 400, "subscription"},
		{"POST", "/snapshots", map[string]any{"name": "before", "subscription": "shop.order.events.member-service-processor"}, 501, ""},
		// The registry and the audit log.
		{"GET", "/consumers?topic=Bad", nil, 400, "topic"},
		{"POST", "/consumers", map[string]any{"topic": "shop.order.events"}, 400, "consumerId"},
		{"POST", "/consumers", map[string]any{"topic": "shop.order.events", "consumerId": "x", "sortOrder": 100001}, 400, "sortOrder"},
		{"POST", "/consumers", map[string]any{"topic": "shop.order.events", "consumerId": "x", "description": long}, 400, "description"},
		{"POST", "/consumers", map[string]any{"topic": "shop.order.events", "consumerId": "x", "enabled": "yes"}, 400, "enabled"},
		{"PATCH", "/consumers/shop.order.events/member-service", map[string]any{}, 400, "enabled"},
		{"PATCH", "/consumers/Bad/member-service", map[string]any{"enabled": false}, 400, "topic"},
		{"POST", "/consumers/shop.order.events/Bad_Name:disable", nil, 400, "consumerId"},
		{"POST", "/consumers/shop.order.events/nobody:disable", nil, 404, ""},
		{"GET", "/audit?limit=0", nil, 400, "limit"},
		{"GET", "/audit?limit=1001", nil, 400, "limit"},
		{"GET", "/audit?action=" + esc("<script>"), nil, 400, "action"},
		{"GET", "/overview?window=10s", nil, 400, "window"},
		{"GET", "/overview?window=1000h", nil, 400, "window"},
		{"GET", "/overview?window=soon", nil, 400, "window"},
		{"GET", "/whoami?x=1", nil, 400, "x"},
		// Routes.
		{"GET", "/nope", nil, 404, ""},
		{"GET", "/consume/shop.order.events.member-service-processor", nil, 404, ""},
		{"GET", "/events/a/b", nil, 404, ""},
		{"DELETE", "/events", nil, 405, ""},
		{"PUT", "/deadletters/dl-1", nil, 405, ""},
		{"GET", "/" + long, nil, 404, ""},
	}
	for _, c := range cases {
		name := c.method + " " + c.path
		if len(name) > 90 {
			name = name[:90]
		}
		t.Run(name, func(t *testing.T) {
			a := e.do(t, c.method, c.path, c.body)
			if a.status != c.status {
				t.Fatalf("%d %s, want %d", a.status, clip(a.raw), c.status)
			}
			if !strings.HasPrefix(a.ctype, "application/json") || a.body["code"] == nil && c.status != 200 {
				t.Errorf("answer %q is not a JSON error: %s", a.ctype, clip(a.raw))
			}
			if c.field != "" {
				if f := a.fields(); len(f) == 0 || f[0] != c.field {
					t.Errorf("fields %v, want %s first: %s", f, c.field, clip(a.raw))
				}
				if msg, _ := a.body["message"].(string); !strings.HasPrefix(msg, c.field+": ") {
					t.Errorf("message %q does not start with the field", msg)
				}
			}
			if strings.Contains(a.raw, long[:300]) {
				t.Error("the answer echoes the 5,000-character value")
			}
		})
	}
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// No answer carries a database's or Firestore's own error text: a store
// failing is a 503/500 with a request id.
func TestNoInternalErrorText(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, dlqreplay.AuthNone, "")
	ev := &event.Event{ID: "evt-failed", Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
		AggregateID: "order-1", Version: 1, Payload: []byte(`{}`)}
	_ = ev.Prepare(time.Now(), event.Limits{})
	if err := e.store.RecordPublishFailure(ctx, ev, 5, "boom", true, time.Now()); err != nil {
		t.Fatal(err)
	}
	// An outbox whose server refuses connections, with a user and password
	// in its URL: what issue 15 saw echoed in 500s.
	dead, err := pgxpool.New(ctx, "postgres://relaybus_admin:hunter2@127.0.0.1:1/relaybus_prod?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	broken := newHandler(t, e, func(o *dlqreplay.Options) { o.DB = dead })
	for _, c := range []struct{ method, path string }{
		{"POST", "/events/evt-failed:repush"},
		{"GET", "/overview"},
	} {
		a := broken.do(t, c.method, c.path, nil)
		if c.path == "/overview" {
			if a.status != 200 || !strings.Contains(a.raw, `"unavailable":["outbox:main"]`) {
				t.Errorf("overview with the outbox down: %d %s", a.status, clip(a.raw))
			}
		} else if a.status != 503 || a.body["code"] != "unavailable" || a.body["requestId"] == "" {
			t.Errorf("%s %s: %d %s, want 503 unavailable with a request id", c.method, c.path, a.status, clip(a.raw))
		}
		for _, leak := range []string{"hunter2", "relaybus_admin", "127.0.0.1", "relaybus_prod", "dial", "connect:", "failed to connect"} {
			if strings.Contains(a.raw, leak) {
				t.Errorf("%s %s leaks %q: %s", c.method, c.path, leak, a.raw)
			}
		}
	}
	// Firestore gone: the client is closed under the API.
	_ = e.store.Close()
	for _, p := range []string{"/events/evt-failed", "/events", "/deadletters", "/consumers"} {
		a := e.do(t, "GET", p, nil)
		if a.status < 500 || a.body["requestId"] == nil {
			t.Errorf("GET %s with Firestore gone: %d %s", p, a.status, clip(a.raw))
		}
		for _, leak := range []string{"rpc error", "grpc", "client connection", "firestore", "Firestore"} {
			if strings.Contains(a.raw, leak) {
				t.Errorf("GET %s leaks %q: %s", p, leak, a.raw)
			}
		}
	}
}

// newHandler serves another API over e's stores, with options changed.
func newHandler(t *testing.T, e *env, opt func(*dlqreplay.Options)) *env {
	t.Helper()
	o := dlqreplay.Options{Archive: e.archive, Ledger: e.store, DB: e.db, Publisher: e.fake.Client, Topology: e.top, Auth: dlqreplay.AuthNone,
		Writers: []string{dlqreplay.Anonymous}, Archivers: []string{dlqreplay.Anonymous}, RateLimit: -1}
	opt(&o)
	h, err := dlqreplay.New(o)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/dlqreplay/", http.StripPrefix("/dlqreplay", h))
	srv := newServer(t, mux)
	c := *e
	c.url, c.h = srv+"/dlqreplay", h
	return &c
}

// GET /events/{id}: a JSON payload as JSON, another as base64 with its
// type; an initiator filled from what is known when the producer gave none.
func TestEventView(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, dlqreplay.AuthNone, "")
	mk := func(id, ptype string, payload []byte, in event.Initiator) {
		ev := &event.Event{ID: id, Type: "order.purchased", Source: "order-service", Topic: "shop.order.events", AggregateID: "order-" + id,
			Version: 1, PayloadType: ptype, Payload: payload, CorrelationID: "checkout-77", Initiator: in}
		if err := ev.Prepare(time.Now(), event.Limits{}); err != nil {
			t.Fatal(err)
		}
		if err := e.store.RecordSent(ctx, model.SentAt(time.Now(), ev)); err != nil {
			t.Fatal(err)
		}
		if _, err := outbox.Enqueue(ctx, e.db, ev); err != nil {
			t.Fatal(err)
		}
	}
	mk("evt-json", "application/json", []byte(`{"orderId":"o-1","amount":120}`), event.Initiator{Service: "web", Operation: "checkout"})
	mk("evt-bin", "application/x-protobuf", []byte{0x0a, 0x03, 'o', '-', '1', 0xff}, event.Initiator{})

	a := e.do(t, "GET", "/events/evt-json", nil)
	ev, _ := a.body["event"].(map[string]any)
	payload, _ := ev["payload"].(map[string]any)
	if a.status != 200 || payload["orderId"] != "o-1" || payload["amount"] != float64(120) || ev["payloadEncoding"] != "json" {
		t.Errorf("JSON payload: %d %v", a.status, ev["payload"])
	}
	if in, _ := ev["initiator"].(map[string]any); in["service"] != "web" || ev["initiatorDerivedFrom"] != nil {
		t.Errorf("the producer's initiator must be shown as it is: %v", ev["initiator"])
	}
	if ob, _ := a.body["outbox"].(map[string]any); ob["state"] != "pending" || ob["database"] != "main" {
		t.Errorf("outbox state %v", a.body["outbox"])
	}
	if rp, _ := a.body["repush"].(map[string]any); rp["allowed"] != false || rp["code"] != "too_recent" {
		t.Errorf("re-push rules %v", a.body["repush"])
	}
	if a.body["summary"] != "0/2 consumed" {
		t.Errorf("summary %v", a.body["summary"])
	}

	a = e.do(t, "GET", "/events/evt-bin", nil)
	ev, _ = a.body["event"].(map[string]any)
	if ev["payload"] != "CgNvLTH/" || ev["payloadEncoding"] != "base64" || ev["payloadType"] != "application/x-protobuf" {
		t.Errorf("binary payload: %v %v %v", ev["payload"], ev["payloadEncoding"], ev["payloadType"])
	}
	in, _ := ev["initiator"].(map[string]any)
	if in["service"] != "order-service" || in["clientRequestId"] != "checkout-77" || ev["initiatorDerivedFrom"] == nil {
		t.Errorf("filled initiator %v from %v", in, ev["initiatorDerivedFrom"])
	}
	// The listing carries n/m consumed.
	a = e.do(t, "GET", "/events?topic=shop.order.events", nil)
	rows, _ := a.body["events"].([]any)
	if len(rows) != 2 {
		t.Fatalf("listing %s", clip(a.raw))
	}
	if r := rows[0].(map[string]any); r["consumed"] != float64(0) || r["expected"] != float64(2) {
		t.Errorf("row %v", r)
	}
}

// dead letters a consumer's subscription gave up on.
func letterOf(t *testing.T, e *env, id string, ev *event.Event, sub string) {
	t.Helper()
	if err := ev.Prepare(time.Now(), event.Limits{}); err != nil {
		t.Fatal(err)
	}
	m, err := cloudevent.Encode(ev, event.EncodingJSON)
	if err != nil {
		t.Fatal(err)
	}
	dl := deadletter.PubSub(m, "p", sub, 5)
	dl.ID = id
	if _, _, err := e.archive.Archive(context.Background(), ev.Topic+".dlq", dl); err != nil {
		t.Fatal(err)
	}
}

// The dry run says what a replay will do, from the consumer's own tables.
func TestReplayDryRunPredictsTheOutcome(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, dlqreplay.AuthNone, "")
	for _, m := range []func(context.Context, *pgxpool.Pool) error{
		func(ctx context.Context, p *pgxpool.Pool) error { return inbox.Migrate(ctx, p) },
		func(ctx context.Context, p *pgxpool.Pool) error { return projection.Migrate(ctx, p) },
	} {
		if err := m(ctx, e.db); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := consumers.New(e.store.Client(), consumers.Options{}).SyncConsumers(ctx, registry.Consumers(e.top), consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	notif := func(id string, v int64) *event.Event {
		return &event.Event{ID: id, Type: "notification.sent", Source: "message-service", Topic: "message.notification.events",
			AggregateType: "notification", AggregateID: "order-9", Version: v, Payload: []byte(`{}`)}
	}
	const strictSub = "message.notification.events.audit-service-recorder"
	// audit-service (strict) holds version 1 of order-9.
	if _, err := e.db.Exec(ctx, `INSERT INTO relaybus_strict_position (consumer_id, aggregate_type, aggregate_id, version, event_id)
		VALUES ('audit-service', 'notification', 'order-9', 1, 'evt-n1')`); err != nil {
		t.Fatal(err)
	}
	letterOf(t, e, "dl-gap", notif("evt-n3", 3), strictSub)
	letterOf(t, e, "dl-next", notif("evt-n2", 2), strictSub)
	letterOf(t, e, "dl-old", notif("evt-n1", 1), strictSub)
	// member-service already applied evt-o1.
	order := &event.Event{ID: "evt-o1", Type: "order.purchased", Source: "order-service", Topic: "shop.order.events", AggregateID: "order-1", Version: 1, Payload: []byte(`{}`)}
	letterOf(t, e, "dl-dup", order, "shop.order.events.member-service-processor")
	if b, err := inbox.Begin(ctx, e.db, "member-service", "evt-o1"); err != nil || !b.Claimed {
		t.Fatal(b, err)
	}
	poison := deadletter.PubSub(event.Message{Data: []byte(`not a cloudevent`), Attributes: map[string]string{"event_id": "evt-p"}}, "p", "shop.order.events.member-service-processor", 5)
	poison.ID = "dl-poison"
	if _, _, err := e.archive.Archive(ctx, "shop.order.events.dlq", poison); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id, outcome, says string
	}{
		{"dl-gap", dlqreplay.PlanBlocked, "versions 2 to 2 must arrive first"},
		{"dl-next", dlqreplay.PlanDeliver, "version 2 is next"},
		{"dl-old", dlqreplay.PlanNoop, "already holds version 1"},
		{"dl-dup", dlqreplay.PlanNoop, "inbox already holds event evt-o1 (applied by attempt 1)"},
		{"dl-poison", dlqreplay.PlanPoison, "still cannot be read as an event"},
	} {
		t.Run(c.id, func(t *testing.T) {
			a := e.do(t, "POST", "/deadletters/"+c.id+":replay", map[string]any{"dryRun": true})
			if a.status != 200 || a.body["outcome"] != c.outcome || !strings.Contains(a.raw, c.says) {
				t.Errorf("%d outcome %v, want %s saying %q:\n%s", a.status, a.body["outcome"], c.outcome, c.says, a.raw)
			}
		})
	}
	if n := len(e.fake.Server.Messages()); n != 0 {
		t.Errorf("dry runs published %d messages", n)
	}
	// Without a connection to the consumer's database the plan says so.
	other := newHandler(t, e, func(o *dlqreplay.Options) { o.Databases = map[string]postgres.DBTX{"main": e.db} })
	a := other.do(t, "POST", "/deadletters/dl-dup:replay", map[string]any{"dryRun": true})
	if a.status != 200 || a.body["outcome"] != dlqreplay.PlanDeliver || !strings.Contains(a.raw, "no connection to member-service's database (member)") {
		t.Errorf("consumer database missing: %s", a.raw)
	}
}

// A bulk replay counts first; the replay refuses a count the operator did
// not confirm, skips letters replayed before and audits who did it.
func TestBulkReplayConfirmsTheCount(t *testing.T) {
	e := newEnv(t, dlqreplay.AuthNone, "")
	for i, id := range []string{"dl-a", "dl-b", "dl-c"} {
		ev := &event.Event{ID: "evt-" + id, Type: "order.purchased", Source: "order-service", Topic: "shop.order.events", AggregateID: "order-" + id,
			Version: int64(i + 1), Payload: []byte(`{}`)}
		letterOf(t, e, id, ev, "shop.order.events.message-service-processor")
	}
	a := e.do(t, "POST", "/deadletters:replay", map[string]any{"consumer": "message-service", "dryRun": true})
	if a.status != 200 || a.body["matched"] != float64(3) {
		t.Fatalf("dry run: %s", a.raw)
	}
	a = e.do(t, "POST", "/deadletters:replay", map[string]any{"consumer": "message-service", "expect": 2})
	if a.status != 409 || a.body["code"] != "count_changed" {
		t.Fatalf("wrong count: %s", a.raw)
	}
	a = e.do(t, "POST", "/deadletters:replay", map[string]any{"consumer": "message-service", "expect": 3})
	if a.status != 200 || a.body["replayed"] != float64(3) || a.body["remaining"] != float64(0) {
		t.Fatalf("replay: %s", a.raw)
	}
	if got := receive(t, e, "shop.order.events.message-service-processor"); len(got) != 3 {
		t.Errorf("message-service received %d", len(got))
	}
	if got := receive(t, e, "shop.order.events.member-service-processor"); len(got) != 0 {
		t.Errorf("member-service received %d", len(got))
	}
	a = e.do(t, "POST", "/deadletters:replay", map[string]any{"consumer": "message-service", "dryRun": true})
	if a.body["matched"] != float64(0) {
		t.Errorf("letters replayed before are counted again: %s", a.raw)
	}
	a = e.do(t, "POST", "/deadletters:replay", map[string]any{"consumer": "message-service", "dryRun": true, "includeReplayed": true})
	if a.body["matched"] != float64(3) {
		t.Errorf("includeReplayed: %s", a.raw)
	}
	a = e.do(t, "GET", "/audit?action=deadletter.&outcome=succeeded", nil)
	entries, _ := a.body["entries"].([]any)
	if len(entries) != 1 || !strings.Contains(a.raw, "replayed 3 of 3 letters") || !strings.Contains(a.raw, `"by":"anonymous"`) {
		t.Errorf("audit %s", a.raw)
	}
}

func newServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// The console is the API's: same auth (but its files load without the
// token in token mode, where the page asks for it), its own strict CSP, no
// file outside it.
func TestConsoleFiles(t *testing.T) {
	get := func(url string, header map[string]string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	cr := newEnvWith(t, behindCloudRun)
	if resp, body := get(cr.url+"/console/", nil); resp.StatusCode != 401 || !strings.Contains(body, `"auth":"cloudrun"`) {
		t.Errorf("console without a token behind cloudrun auth: %d %s", resp.StatusCode, body)
	}
	alice := map[string]string{"Authorization": "Bearer " + cloudRunToken(person("alice@example.com"))}
	resp, body := get(cr.url+"/console/", alice)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(body, `<script src="app.js">`) {
		t.Fatalf("console page: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), clip(body))
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "connect-src 'self'") || strings.Contains(csp, "unsafe") {
		t.Errorf("CSP %q", csp)
	}
	for _, f := range []struct{ path, ctype string }{{"/console/app.js", "text/javascript"}, {"/console/app.css", "text/css"}} {
		if resp, body := get(cr.url+f.path, alice); resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), f.ctype) || len(body) < 1000 {
			t.Errorf("%s: %d %s", f.path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	for _, p := range []string{"/console/nope.js", "/console/%2e%2e/env.go", "/console/app.js/x"} {
		if resp, body := get(cr.url+p, alice); resp.StatusCode != 404 || !strings.Contains(body, `"code":"not_found"`) {
			t.Errorf("%s: %d %s", p, resp.StatusCode, clip(body))
		}
	}
	if resp, _ := get(cr.url+"/console", alice); resp.StatusCode != 302 || resp.Header.Get("Location") != "console/" {
		t.Errorf("/console redirects with %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	tok := newEnvWith(t, func(o *dlqreplay.Options) {
		o.Auth, o.Token, o.Audience, o.Archivers = dlqreplay.AuthToken, personalTokens, serviceURL, []string{"relaybus-dlq-push@relaybus-test.iam.gserviceaccount.com"}
	})
	if resp, _ := get(tok.url+"/console/", nil); resp.StatusCode != 200 {
		t.Errorf("console files in token mode: %d", resp.StatusCode)
	}
	if resp, body := get(tok.url+"/whoami", nil); resp.StatusCode != 401 || !strings.Contains(body, `"auth":"token"`) {
		t.Errorf("whoami without the token: %d %s", resp.StatusCode, body)
	}
}

// A browser on another site cannot make an operator's browser write
// (net/http.CrossOriginProtection); the CLI and Pub/Sub send no such
// headers and pass.
func TestCrossOriginWritesRefused(t *testing.T) {
	e := newEnv(t, dlqreplay.AuthNone, "")
	req, _ := http.NewRequest("DELETE", e.url+"/deadletters/dl-1", nil)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Errorf("cross-site DELETE: %d, want 403", resp.StatusCode)
	}
	req, _ = http.NewRequest("GET", e.url+"/deadletters", nil)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("cross-site GET: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("cross-site GET: %d, want 200", resp.StatusCode)
	}
	if a := e.do(t, "DELETE", "/deadletters/dl-1", nil); a.status != 404 {
		t.Errorf("same-origin DELETE: %d", a.status)
	}
}
