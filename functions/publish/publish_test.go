package publish_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/fnproc"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

func TestMain(m *testing.M) {
	fnproc.Serve() // BenchmarkPublish runs this binary again as the function
	pgtest.Main(m)
}

// testTopology has a consumed topic, a topic whose only consumer is
// disabled, and (by omission) topics nobody declared.
const testTopology = `
rollup:
  topic: relaybus.ledger.rollup
relay:
  schedule: "* * * * *"
  time_budget_seconds: 45
  attempt_deadline_seconds: 120
topics:
  - name: shop.order.events
    consumers:
      - service: member-service
      - service: message-service
        delivery: eventarc
  - name: shop.cart.events
    consumers:
      - service: cart-service
        enabled: false
`

func loadTopology(t testing.TB) *topology.Topology {
	t.Helper()
	top, err := topology.Parse([]byte(testTopology))
	if err != nil {
		t.Fatal(err)
	}
	return top
}

// syncBuffer is a log sink safe for concurrent handlers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines returns the logged JSON records.
func (s *syncBuffer) lines(t testing.TB) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(s.b.Bytes()), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("log line is not JSON: %s", l)
		}
		out = append(out, m)
	}
	return out
}

type harness struct {
	pool *pgxpool.Pool
	srv  *httptest.Server
	url  string
	logs *syncBuffer
}

// newHarness serves a publish handler over real HTTP, on a fresh outbox.
// adjust may change the options (the DB and Registry are filled in).
func newHarness(t *testing.T, adjust func(*publish.Options)) *harness {
	t.Helper()
	pool := pgtest.Schema(t)
	if err := outbox.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	opts := publish.Options{
		DB:       pool,
		Registry: registry.Cached(registry.FromTopology(loadTopology(t)), time.Minute),
		Logger:   logging.New(logs, logging.Options{ProjectID: "-"}),
		Topology: loadTopology(t),
	}
	if adjust != nil {
		adjust(&opts)
	}
	h, err := publish.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &harness{pool: pool, srv: srv, url: srv.URL, logs: logs}
}

func (h *harness) rows(t testing.TB) int {
	t.Helper()
	var n int
	if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM relaybus_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// row is what the outbox holds for one event.
type row struct {
	aggType, aggID, typ, topic, source, schema, payloadType string
	version                                                 int64
	payload                                                 []byte
	occurred                                                time.Time
	trace, span, parent, corr                               string
	initiator                                               map[string]string
	expire                                                  *time.Time
}

func (h *harness) row(t testing.TB, id string) row {
	t.Helper()
	var r row
	err := h.pool.QueryRow(context.Background(), `SELECT aggregatetype, aggregateid, event_type, topic, source,
		schema_version, payload_type, version, payload, occurred_at, trace_id, span_id, parent_event_id,
		correlation_id, initiator, expire_at FROM relaybus_outbox WHERE id = $1`, id).Scan(
		&r.aggType, &r.aggID, &r.typ, &r.topic, &r.source, &r.schema, &r.payloadType, &r.version, &r.payload,
		&r.occurred, &r.trace, &r.span, &r.parent, &r.corr, &r.initiator, &r.expire)
	if err != nil {
		t.Fatalf("outbox row %s: %v", id, err)
	}
	return r
}

// post sends body with the given headers and returns the status and body.
func post(t testing.TB, url string, body []byte, headers ...string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return do(t, req)
}

func do(t testing.TB, req *http.Request) (int, []byte, http.Header) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

func decodeJSON[T any](t testing.TB, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("answer is not the expected JSON: %v: %s", err, b)
	}
	return v
}

// envelope returns a valid plain envelope for shop.order.events, with
// overrides applied (a nil value deletes the field).
func envelope(overrides map[string]any) map[string]any {
	m := map[string]any{
		"eventId":     "evt-" + event.NewID(),
		"eventType":   "order.purchased",
		"topic":       "shop.order.events",
		"aggregateId": "order-1",
		"version":     1,
		"payload":     map[string]any{"orderId": "order-1", "amount": 99},
		"initiator":   map[string]any{"service": "order-service", "userId": "user-7"},
	}
	for k, v := range overrides {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	return m
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEnvelopeIsAcceptedAndStoredAsSent(t *testing.T) {
	h := newHarness(t, nil)
	env := envelope(map[string]any{
		"eventId": "evt-100", "aggregateId": "  order-42 ", "version": "3",
		"occurredAt": "2026-01-02T03:04:05.5+08:00", "schemaVersion": "v2",
		"traceId": "trace-abc", "spanId": "span-1", "parentEventId": "evt-99", "correlationId": "corr-1",
		"initiator":  map[string]any{"service": "order-service", "operation": "createOrder", "userId": "user-7", "clientRequestId": "req-1"},
		"expireAt":   "2026-02-01T00:00:00Z",
		"source":     "order-service/api",
		"payload":    map[string]any{"orderId": "order-42"},
		"unknownKey": "ignored",
	})
	status, body, hdr := post(t, h.url, mustJSON(t, env), "Content-Type", "application/json")
	if status != http.StatusAccepted {
		t.Fatalf("status %d, want 202: %s", status, body)
	}
	if ct := hdr.Get("Content-Type"); ct != "application/json" {
		t.Errorf("answer Content-Type %q", ct)
	}
	res := decodeJSON[publish.Result](t, body)
	want := publish.Result{EventID: "evt-100", Status: publish.StatusPending, Topic: "shop.order.events",
		AggregateID: "order-42", Version: 3, TraceID: "trace-abc"}
	if res != want {
		t.Fatalf("answer %+v, want %+v", res, want)
	}
	r := h.row(t, "evt-100")
	if r.aggType != "order" || r.aggID != "order-42" || r.typ != "order.purchased" || r.version != 3 ||
		r.topic != "shop.order.events" || r.source != "order-service/api" || r.schema != "v2" ||
		r.payloadType != "application/json" || string(r.payload) != `{"orderId":"order-42"}` ||
		!r.occurred.Equal(time.Date(2026, 1, 1, 19, 4, 5, 5e8, time.UTC)) || r.trace != "trace-abc" ||
		r.span != "span-1" || r.parent != "evt-99" || r.corr != "corr-1" ||
		r.initiator["operation"] != "createOrder" || r.initiator["clientRequestId"] != "req-1" ||
		r.expire == nil || !r.expire.Equal(time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("stored row %+v", r)
	}
}

func TestEnvelopeDefaultsAndTraceparent(t *testing.T) {
	h := newHarness(t, nil)
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	// No eventId, occurredAt, traceId: filled, the trace from traceparent.
	env := envelope(map[string]any{"eventId": nil})
	before := time.Now().Add(-time.Second)
	status, body, _ := post(t, h.url, mustJSON(t, env), "Content-Type", "application/json; charset=utf-8", "traceparent", traceparent)
	if status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, body)
	}
	res := decodeJSON[publish.Result](t, body)
	if res.EventID == "" || res.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("answer %+v: want a generated id and the traceparent's trace id", res)
	}
	r := h.row(t, res.EventID)
	if r.trace != "4bf92f3577b34da6a3ce929d0e0e4736" || r.span != "00f067aa0ba902b7" || r.occurred.Before(before) ||
		r.source != "order-service" || r.schema != "v1" {
		t.Fatalf("stored %+v: want the traceparent's ids, now as occurredAt, source from the initiator, schema v1", r)
	}

	// An event's own trace id wins over the header; a bad header is ignored.
	env = envelope(map[string]any{"traceId": "own-trace", "aggregateId": "order-3"})
	_, body, _ = post(t, h.url, mustJSON(t, env), "Content-Type", "application/json", "traceparent", traceparent)
	if r := h.row(t, decodeJSON[publish.Result](t, body).EventID); r.trace != "own-trace" || r.span != "" {
		t.Fatalf("own trace: stored trace %q span %q", r.trace, r.span)
	}
	env = envelope(map[string]any{"aggregateId": "order-2"})
	_, body, _ = post(t, h.url, mustJSON(t, env), "Content-Type", "application/json", "traceparent", "00-00000000000000000000000000000000-00f067aa0ba902b7-01")
	if r := h.row(t, decodeJSON[publish.Result](t, body).EventID); len(r.trace) != 32 || r.trace == strings.Repeat("0", 32) || r.span != "" {
		t.Fatalf("invalid traceparent: stored trace %q span %q, want a fresh trace id", r.trace, r.span)
	}
}

func TestEnvelopeBatch(t *testing.T) {
	h := newHarness(t, nil)
	batch := []map[string]any{
		envelope(map[string]any{"eventId": "b-1", "aggregateId": "order-1", "version": 1}),
		envelope(map[string]any{"eventId": "b-2", "aggregateId": "order-1", "version": 2}),
		envelope(map[string]any{"eventId": "b-3", "topic": "shop.cart.events", "eventType": "cart.emptied", "aggregateId": "cart-1"}),
		envelope(map[string]any{"eventId": "b-4", "aggregateId": "order-2", "payloadType": "application/octet-stream", "payload": "AAEC"}),
	}
	status, body, _ := post(t, h.url, mustJSON(t, batch), "Content-Type", "application/json")
	if status != http.StatusAccepted {
		t.Fatalf("status %d: %s", status, body)
	}
	got := decodeJSON[publish.BatchResponse](t, body).Results
	if len(got) != 4 {
		t.Fatalf("%d results: %s", len(got), body)
	}
	for i, want := range []string{publish.StatusPending, publish.StatusPending, publish.StatusSkipped, publish.StatusPending} {
		if got[i].Status != want || got[i].EventID != batch[i]["eventId"] {
			t.Errorf("result %d: %+v, want %s for %s", i, got[i], want, batch[i]["eventId"])
		}
	}
	if !strings.Contains(got[2].Reason, "shop.cart.events") {
		t.Errorf("skip reason %q does not name the topic", got[2].Reason)
	}
	if n := h.rows(t); n != 3 {
		t.Fatalf("%d rows, want 3 (the skipped event is not written)", n)
	}
	if r := h.row(t, "b-4"); !bytes.Equal(r.payload, []byte{0, 1, 2}) {
		t.Fatalf("binary payload stored as %v", r.payload)
	}
}

func TestSkippedTopicWritesNothingAndLogsAnError(t *testing.T) {
	h := newHarness(t, nil)
	for _, topic := range []string{"shop.cart.events", "shop.nobody.events"} {
		env := envelope(map[string]any{"topic": topic, "eventId": "skip-" + topic})
		status, body, _ := post(t, h.url, mustJSON(t, env), "Content-Type", "application/json")
		if status != http.StatusOK {
			t.Fatalf("%s: status %d, want 200: %s", topic, status, body)
		}
		res := decodeJSON[publish.Result](t, body)
		if res.Status != publish.StatusSkipped || res.EventID != "skip-"+topic || !strings.Contains(res.Reason, "no enabled consumer") {
			t.Fatalf("%s: answer %+v", topic, res)
		}
	}
	if n := h.rows(t); n != 0 {
		t.Fatalf("%d rows written for skipped events", n)
	}
	var errs int
	for _, l := range h.logs.lines(t) {
		if l["severity"] == "ERROR" && strings.HasPrefix(l["event_id"].(string), "skip-") && l["topic"] != nil && l["trace_id"] != "" {
			errs++
		}
	}
	if errs != 2 {
		t.Fatalf("%d ERROR log lines with the event's fields, want 2:\n%v", errs, h.logs.lines(t))
	}
}

func TestDuplicateEventIDIsIdempotent(t *testing.T) {
	h := newHarness(t, nil)
	body := mustJSON(t, envelope(map[string]any{"eventId": "dup-1"}))
	status1, b1, _ := post(t, h.url, body, "Content-Type", "application/json")
	status2, b2, _ := post(t, h.url, body, "Content-Type", "application/json")
	if status1 != http.StatusAccepted || status2 != http.StatusAccepted {
		t.Fatalf("statuses %d, %d: %s %s", status1, status2, b1, b2)
	}
	r1, r2 := decodeJSON[publish.Result](t, b1), decodeJSON[publish.Result](t, b2)
	if r1.Duplicate || !r2.Duplicate {
		t.Fatalf("duplicate flags %v, %v, want false, true", r1.Duplicate, r2.Duplicate)
	}
	r2.Duplicate = false
	if r1 != r2 {
		t.Fatalf("the repeat answered %+v, the first %+v", r2, r1)
	}
	if n := h.rows(t); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
	// A repeat inside a batch is a duplicate too, next to a new event.
	batch := []map[string]any{
		envelope(map[string]any{"eventId": "dup-1"}),
		envelope(map[string]any{"eventId": "dup-2", "version": 2}),
	}
	_, b, _ := post(t, h.url, mustJSON(t, batch), "Content-Type", "application/json")
	res := decodeJSON[publish.BatchResponse](t, b).Results
	if !res[0].Duplicate || res[1].Duplicate || res[1].Status != publish.StatusPending {
		t.Fatalf("batch results %+v", res)
	}
	if n := h.rows(t); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
}

func TestVersionConflictIs409AndWritesNothing(t *testing.T) {
	h := newHarness(t, nil)
	if s, b, _ := post(t, h.url, mustJSON(t, envelope(map[string]any{"eventId": "v-1"})), "Content-Type", "application/json"); s != http.StatusAccepted {
		t.Fatalf("status %d: %s", s, b)
	}
	// Same aggregate and version, another id; in a batch with a new event,
	// which must not be written either.
	batch := []map[string]any{
		envelope(map[string]any{"eventId": "v-2", "aggregateId": "order-9"}),
		envelope(map[string]any{"eventId": "v-3"}),
	}
	status, body, _ := post(t, h.url, mustJSON(t, batch), "Content-Type", "application/json")
	if status != http.StatusConflict {
		t.Fatalf("status %d, want 409: %s", status, body)
	}
	e := decodeJSON[publish.ErrorResponse](t, body)
	if e.Error != publish.CodeVersionConflict || !strings.Contains(e.Message, "version") {
		t.Fatalf("answer %+v", e)
	}
	// The database's words (constraint, key, stored values) stay out.
	for _, leak := range []string{"relaybus_outbox", "Key (", "already exists", "order-1, 1"} {
		if strings.Contains(string(body), leak) {
			t.Errorf("the 409 quotes the database (%q): %s", leak, body)
		}
	}
	if n := h.rows(t); n != 1 {
		t.Fatalf("%d rows, want 1 (a refused batch writes nothing)", n)
	}
}

// badInput is one request the function must refuse.
type badInput struct {
	name    string
	method  string
	headers []string
	body    []byte
	status  int
	code    string
	// fields must each appear in the answer's field list and message.
	fields []string
	// index, when set, is the batch index every field problem must carry.
	index *int
}

func intp(i int) *int { return &i }

func TestBadInputIsRefusedAndWritesNothing(t *testing.T) {
	const payloadLimit = 1000
	h := newHarness(t, func(o *publish.Options) {
		o.MaxPayloadBytes = payloadLimit
		o.MaxBodyBytes = 8 << 10
		o.MaxBatchEvents = 3
	})
	j := func(v any) []byte { return mustJSON(t, v) }
	jsonCT := []string{"Content-Type", "application/json"}
	big := strings.Repeat("x", payloadLimit)
	cases := []badInput{
		{name: "GET", method: http.MethodGet, status: 405, code: publish.CodeMethodNotAllowed},
		{name: "PUT", method: http.MethodPut, headers: jsonCT, body: j(envelope(nil)), status: 405, code: publish.CodeMethodNotAllowed},
		{name: "text/plain", headers: []string{"Content-Type", "text/plain"}, body: j(envelope(nil)), status: 415, code: publish.CodeUnsupportedMediaType},
		{name: "no content type", body: j(envelope(nil)), status: 415, code: publish.CodeUnsupportedMediaType},
		{name: "form", headers: []string{"Content-Type", "application/x-www-form-urlencoded"}, body: []byte("a=b"), status: 415, code: publish.CodeUnsupportedMediaType},
		{name: "not JSON", headers: jsonCT, body: []byte(`{"eventId": `), status: 400, code: publish.CodeMalformed},
		{name: "JSON string", headers: jsonCT, body: []byte(`"hello"`), status: 400, code: publish.CodeMalformed},
		{name: "empty body", headers: jsonCT, body: nil, status: 400, code: publish.CodeMalformed},
		{name: "every field error", headers: jsonCT, status: 400, code: publish.CodeInvalid,
			body: j(envelope(map[string]any{"eventType": nil, "aggregateId": "order 1/x", "version": 0,
				"topic": "Shop_Orders", "schemaVersion": "1", "traceId": "bad trace", "initiator": nil})),
			fields: []string{"eventType", "source", "topic", "aggregateType", "aggregateId", "version", "schemaVersion", "traceId"}},
		{name: "wrong JSON type", headers: jsonCT, body: j(envelope(map[string]any{"topic": 7})), status: 400, code: publish.CodeInvalid, fields: []string{"topic"}},
		{name: "version not an integer", headers: jsonCT, body: j(envelope(map[string]any{"version": "seven"})), status: 400, code: publish.CodeInvalid, fields: []string{"version"}},
		{name: "bad occurredAt", headers: jsonCT, body: j(envelope(map[string]any{"occurredAt": "yesterday"})), status: 400, code: publish.CodeInvalid, fields: []string{"occurredAt"}},
		{name: "payload not JSON", headers: jsonCT, body: j(envelope(map[string]any{"payloadType": "application/json", "payload": nil})), status: 400, code: publish.CodeInvalid, fields: []string{"payload"}},
		{name: "expireAt before occurredAt", headers: jsonCT, body: j(envelope(map[string]any{"occurredAt": "2026-01-02T00:00:00Z", "expireAt": "2026-01-01T00:00:00Z"})), status: 400, code: publish.CodeInvalid, fields: []string{"expireAt"}},
		{name: "payload over the limit", headers: jsonCT, body: j(envelope(map[string]any{"payload": map[string]string{"s": big}})), status: 413, code: publish.CodeTooLarge, fields: []string{"payload"}},
		{name: "body over the limit", headers: jsonCT, body: j(envelope(map[string]any{"payload": map[string]string{"s": strings.Repeat("y", 9<<10)}})), status: 413, code: publish.CodeTooLarge},
		{name: "empty batch", headers: jsonCT, body: []byte(`[]`), status: 400, code: publish.CodeInvalid},
		{name: "batch too long", headers: jsonCT, body: j([]any{envelope(nil), envelope(nil), envelope(nil), envelope(nil)}), status: 413, code: publish.CodeTooLarge},
		{name: "batch with one bad event", headers: jsonCT, status: 400, code: publish.CodeInvalid,
			body:   j([]any{envelope(map[string]any{"aggregateId": "a-1"}), envelope(map[string]any{"aggregateId": "a-2", "version": -1})}),
			fields: []string{"version"}, index: intp(1)},
		{name: "batch with a non-object", headers: jsonCT, status: 400, code: publish.CodeInvalid,
			body: []byte(`[` + string(j(envelope(nil))) + `, 42]`), fields: []string{"event"}, index: intp(1)},
		{name: "batch repeating an eventId", headers: jsonCT, status: 400, code: publish.CodeInvalid,
			body:   j([]any{envelope(map[string]any{"eventId": "same", "version": 1}), envelope(map[string]any{"eventId": "same", "version": 2})}),
			fields: []string{"eventId"}, index: intp(1)},
		{name: "a dead-letter topic", headers: jsonCT, body: j(envelope(map[string]any{"topic": "shop.order.dlq", "aggregateType": "order"})), status: 400, code: publish.CodeInvalid, fields: []string{"topic"}},
		{name: "another topic's aggregate type", headers: jsonCT, body: j(envelope(map[string]any{"topic": "shop.cart.events", "aggregateType": "order"})), status: 400, code: publish.CodeInvalid, fields: []string{"aggregateType"}},
		{name: "batch repeating a version", headers: jsonCT, status: 400, code: publish.CodeInvalid,
			body:   j([]any{envelope(map[string]any{"version": 4}), envelope(map[string]any{"version": 4})}),
			fields: []string{"version"}, index: intp(1)},
		{name: "binary: bad subject and version", status: 400, code: publish.CodeInvalid, body: []byte(`{"a":1}`),
			headers: []string{"Content-Type", "application/json", "ce-specversion", "1.0", "ce-id", "c-1", "ce-type", "order.purchased",
				"ce-source", "order-service", "ce-subject", "has space", "ce-topic", "shop.order.events", "ce-version", "x"},
			fields: []string{"aggregateId", "version"}},
		{name: "deliverAt not a time", headers: jsonCT, body: j(envelope(map[string]any{"deliverAt": "tomorrow"})), status: 400, code: publish.CodeInvalid, fields: []string{"deliverAt"}},
		{name: "deliverAt too far ahead", headers: jsonCT, body: j(envelope(map[string]any{"deliverAt": time.Now().Add(event.MaxDeliverDelay + time.Hour).Format(time.RFC3339)})), status: 400, code: publish.CodeInvalid, fields: []string{"deliverAt"}},
		{name: "binary: deliverat not a time", status: 400, code: publish.CodeInvalid, body: []byte(`{"a":1}`),
			headers: []string{"Content-Type", "application/json", "ce-specversion", "1.0", "ce-id", "c-1", "ce-type", "order.purchased",
				"ce-source", "order-service", "ce-subject", "order-1", "ce-topic", "shop.order.events", "ce-version", "1", "ce-deliverat", "soon"},
			fields: []string{"deliverAt"}},
		{name: "binary: no id, no type", status: 400, code: publish.CodeInvalid, body: []byte(`{"a":1}`),
			headers: []string{"Content-Type", "application/json", "ce-specversion", "1.0", "ce-source", "order-service",
				"ce-subject", "order-1", "ce-topic", "shop.order.events", "ce-version", "1"},
			fields: []string{"eventId", "eventType"}},
		{name: "binary: bad time", status: 400, code: publish.CodeMalformed, body: []byte(`{"a":1}`),
			headers: []string{"Content-Type", "application/json", "ce-specversion", "1.0", "ce-id", "c-1", "ce-type", "order.purchased",
				"ce-source", "order-service", "ce-subject", "order-1", "ce-topic", "shop.order.events", "ce-version", "1", "ce-time", "noon"}},
		{name: "binary: unknown specversion", status: 400, code: publish.CodeInvalid, body: []byte(`{"a":1}`),
			headers: []string{"Content-Type", "application/json", "ce-specversion", "9.9", "ce-id", "c-1"}},
		{name: "binary: payload over the limit", status: 413, code: publish.CodeTooLarge, body: []byte(`"` + big + `"`),
			headers: []string{"Content-Type", "application/json", "ce-specversion", "1.0", "ce-id", "c-1", "ce-type", "order.purchased",
				"ce-source", "order-service", "ce-subject", "order-1", "ce-topic", "shop.order.events", "ce-version", "1"},
			fields: []string{"payload"}},
		{name: "structured: not JSON", headers: []string{"Content-Type", "application/cloudevents+json"}, body: []byte(`{`), status: 400, code: publish.CodeMalformed},
		{name: "structured: empty", headers: []string{"Content-Type", "application/cloudevents+json"}, status: 400, code: publish.CodeMalformed},
		{name: "structured: no topic, no version", headers: []string{"Content-Type", "application/cloudevents+json"}, status: 400, code: publish.CodeInvalid,
			body:   []byte(`{"specversion":"1.0","id":"c-2","type":"order.purchased","source":"order-service","subject":"order-1","data":{"a":1}}`),
			fields: []string{"topic", "version"}},
		{name: "CloudEvents batch: not an array", headers: []string{"Content-Type", "application/cloudevents-batch+json"}, body: []byte(`{}`), status: 400, code: publish.CodeMalformed},
		{name: "CloudEvents batch: bad element", headers: []string{"Content-Type", "application/cloudevents-batch+json"}, status: 400, code: publish.CodeInvalid,
			body: []byte(`[{"specversion":"1.0","id":"c-3","type":"order.purchased","source":"s","subject":"order-1","topic":"shop.order.events","version":1,"data":{}},
				{"specversion":"1.0","id":"c-4","type":"order.purchased","source":"s","subject":"order-1","topic":"shop.order.events","version":"two"}]`),
			fields: []string{"version"}, index: intp(1)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			method := c.method
			if method == "" {
				method = http.MethodPost
			}
			req, _ := http.NewRequest(method, h.url, bytes.NewReader(c.body))
			for i := 0; i+1 < len(c.headers); i += 2 {
				req.Header.Set(c.headers[i], c.headers[i+1])
			}
			if c.headers == nil && c.body != nil {
				req.Header.Del("Content-Type")
			}
			status, body, hdr := do(t, req)
			if status != c.status {
				t.Fatalf("status %d, want %d: %s", status, c.status, body)
			}
			e := decodeJSON[publish.ErrorResponse](t, body)
			if e.Error != c.code || e.Message == "" {
				t.Fatalf("answer %+v, want error code %s and a message", e, c.code)
			}
			if status == 405 && hdr.Get("Allow") != http.MethodPost {
				t.Errorf("405 without Allow: POST (got %q)", hdr.Get("Allow"))
			}
			for _, f := range c.fields {
				found := false
				for _, p := range e.Fields {
					if p.Field == f && p.Rule != "" {
						found = true
					}
				}
				if !found || !strings.Contains(e.Message, f+":") {
					t.Errorf("field %s missing from the answer %s", f, body)
				}
			}
			if c.index != nil {
				if len(e.Fields) == 0 {
					t.Fatalf("no field problems in %s", body)
				}
				for _, p := range e.Fields {
					if p.Index == nil || *p.Index != *c.index {
						t.Errorf("problem %+v: want index %d", p, *c.index)
					}
				}
			}
		})
	}
	if n := h.rows(t); n != 0 {
		t.Fatalf("%d rows written by refused requests", n)
	}
}

func TestServesUnderStripPrefix(t *testing.T) {
	pool := pgtest.Schema(t)
	if err := outbox.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	h, err := publish.New(publish.Options{DB: pool, Registry: registry.FromTopology(loadTopology(t))})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/publish/", http.StripPrefix("/publish", h))
	mux.Handle("/publish", http.StripPrefix("/publish", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, path := range []string{"/publish", "/publish/"} {
		env := envelope(map[string]any{"aggregateId": "order" + strings.ReplaceAll(path, "/", "-")})
		status, body, _ := post(t, srv.URL+path, mustJSON(t, env), "Content-Type", "application/json")
		if status != http.StatusAccepted {
			t.Fatalf("%s: status %d: %s", path, status, body)
		}
	}
}

func TestOptionsAreChecked(t *testing.T) {
	pool := pgtest.Schema(t)
	reg := registry.FromTopology(loadTopology(t))
	for name, o := range map[string]publish.Options{
		"no DB":              {Registry: reg},
		"no registry":        {DB: pool},
		"payload over limit": {DB: pool, Registry: reg, MaxPayloadBytes: event.MaxPayloadLimit + 1},
		"negative payload":   {DB: pool, Registry: reg, MaxPayloadBytes: -1},
	} {
		if _, err := publish.New(o); err == nil {
			t.Errorf("%s: New accepted %+v", name, o)
		}
	}
}

// brokenRegistry is a registry whose backend is down.
type brokenRegistry struct{}

func (brokenRegistry) ExpectedConsumers(context.Context, string) ([]registry.Consumer, error) {
	return nil, errors.New("firestore: unavailable")
}

func TestUnavailableDependenciesAre503AndWriteNothing(t *testing.T) {
	h := newHarness(t, func(o *publish.Options) { o.Registry = brokenRegistry{} })
	status, body, hdr := post(t, h.url, mustJSON(t, envelope(nil)), "Content-Type", "application/json")
	if status != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("registry down: status %d (Retry-After %q): %s", status, hdr.Get("Retry-After"), body)
	}
	if e := decodeJSON[publish.ErrorResponse](t, body); e.Error != publish.CodeUnavailable {
		t.Fatalf("answer %+v", e)
	}
	if n := h.rows(t); n != 0 {
		t.Fatalf("%d rows", n)
	}

	// The outbox's database is gone (its pool closed).
	pool := pgtest.Schema(t)
	if err := outbox.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	ph, err := publish.New(publish.Options{DB: pool, Registry: registry.FromTopology(loadTopology(t))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ph)
	defer srv.Close()
	status, body, _ = post(t, srv.URL, mustJSON(t, envelope(nil)), "Content-Type", "application/json")
	if e := decodeJSON[publish.ErrorResponse](t, body); status != http.StatusServiceUnavailable || e.Error != publish.CodeUnavailable {
		t.Fatalf("database down: status %d: %s", status, body)
	}
}

// An event published without an initiator gets one from what the request
// says: the source service, and the request's id (X-Request-Id, or the
// trace Cloud Run's front end puts in X-Cloud-Trace-Context).
func TestTheInitiatorIsFilledFromTheRequest(t *testing.T) {
	h := newHarness(t, nil)
	for i, c := range []struct {
		header, value, want string
	}{
		{"X-Request-Id", "req-42", "req-42"},
		{"X-Cloud-Trace-Context", "105445aa7843bc8bf206b12000100000/1;o=1", "105445aa7843bc8bf206b12000100000"},
		{"X-Request-Id", strings.Repeat("r", 200), ""}, // too long to keep
	} {
		env := envelope(map[string]any{"initiator": nil, "source": "order-service", "eventId": "evt-" + event.NewID(), "version": i + 1})
		status, body, _ := post(t, h.url, mustJSON(t, env), "Content-Type", "application/json", c.header, c.value)
		if status != http.StatusAccepted {
			t.Fatalf("%s: %d %s", c.header, status, body)
		}
		r := h.row(t, env["eventId"].(string))
		if r.initiator["service"] != "order-service" || r.initiator["clientRequestId"] != c.want {
			t.Errorf("%s %q: initiator %v, want service order-service, request id %q", c.header, c.value, r.initiator, c.want)
		}
	}
}
