package client_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/client"
	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

// testTopology has a consumed topic and one whose only consumer is
// disabled (publish skips its events).
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
  - name: shop.cart.events
    consumers:
      - service: cart-service
        enabled: false
`

// exampleEndpoint is a publish function on a real Postgres schema for the
// package's Examples, started by TestMain.
var exampleEndpoint string

func TestMain(m *testing.M) {
	tb := &mainTB{}
	code := func() int {
		defer tb.cleanup()
		h := newPublish(tb, nil)
		srv := httptest.NewServer(h.handler)
		defer srv.Close()
		exampleEndpoint = srv.URL
		return m.Run()
	}()
	pgtest.Cleanup()
	os.Exit(code)
}

// mainTB lets TestMain set up the Examples' publish function with the
// helpers tests use: it fails the run on Fatal and runs the cleanups at
// the end.
type mainTB struct {
	testing.TB
	cleanups []func()
}

func (*mainTB) Helper()            {}
func (*mainTB) Name() string       { return "client_examples" }
func (m *mainTB) Cleanup(f func()) { m.cleanups = append(m.cleanups, f) }
func (m *mainTB) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "TestMain: "+format+"\n", args...)
	m.cleanup()
	os.Exit(1)
}
func (m *mainTB) Fatal(args ...any) { m.Fatalf("%s", fmt.Sprint(args...)) }
func (m *mainTB) cleanup() {
	for i := len(m.cleanups) - 1; i >= 0; i-- {
		m.cleanups[i]()
	}
	m.cleanups = nil
}

// publishFn is the real publish function on a fresh outbox.
type publishFn struct {
	pool    *pgxpool.Pool
	handler http.Handler
}

func newPublish(t testing.TB, adjust func(*publish.Options)) *publishFn {
	t.Helper()
	pool := pgtest.Schema(t)
	if err := outbox.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Parse([]byte(testTopology))
	if err != nil {
		t.Fatal(err)
	}
	o := publish.Options{DB: pool, Registry: registry.Cached(registry.FromTopology(top), time.Minute)}
	if adjust != nil {
		adjust(&o)
	}
	h, err := publish.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return &publishFn{pool: pool, handler: h}
}

// serve serves h (the publish function, or a wrapper of it) over real HTTP.
func serve(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func newClient(t *testing.T, endpoint string, o client.Options) *client.Client {
	t.Helper()
	if o.InitialBackoff == 0 {
		o.InitialBackoff = 10 * time.Millisecond
	}
	c, err := client.New(endpoint, o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// rows counts the outbox rows.
func (p *publishFn) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := p.pool.QueryRow(context.Background(), `SELECT count(*) FROM relaybus_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// stored is what the outbox holds of one event.
type stored struct {
	typ, aggID, schema, payloadType, source, topic string
	version                                        int64
	payload                                        string
}

func (p *publishFn) row(t *testing.T, id string) stored {
	t.Helper()
	var s stored
	err := p.pool.QueryRow(context.Background(), `SELECT event_type, aggregateid, schema_version, payload_type, source,
		topic, version, convert_from(payload, 'UTF8') FROM relaybus_outbox WHERE id = $1`, id).Scan(
		&s.typ, &s.aggID, &s.schema, &s.payloadType, &s.source, &s.topic, &s.version, &s.payload)
	if err != nil {
		t.Fatalf("outbox row %s: %v", id, err)
	}
	return s
}

func order(aggID string, version int64) *event.Event {
	return &event.Event{Type: "order.purchased", Topic: "shop.order.events", AggregateID: aggID, Version: version,
		SchemaVersion: "v2", Payload: []byte(`{"amount":42}`)}
}

// Each mode writes the event publish stores field for field, and the
// client gives an event without an id one before sending.
func TestPublishInEveryMode(t *testing.T) {
	p := newPublish(t, nil)
	url := serve(t, p.handler)
	for i, mode := range []client.Mode{client.ModeBinary, client.ModeStructured, client.ModeEnvelope} {
		t.Run(string(mode), func(t *testing.T) {
			c := newClient(t, url, client.Options{Mode: mode, Source: "order-service"})
			e := order(fmt.Sprintf("o-%d", i), 1)
			res, err := c.Publish(context.Background(), e)
			if err != nil {
				t.Fatal(err)
			}
			if e.ID == "" || res.EventID != e.ID {
				t.Fatalf("result id %q, event id %q: the client must send (and keep) an id", res.EventID, e.ID)
			}
			if res.Status != client.StatusPending || res.Duplicate {
				t.Errorf("result %+v, want pending, not a duplicate", res)
			}
			got := p.row(t, e.ID)
			want := stored{typ: "order.purchased", aggID: e.AggregateID, schema: "v2", payloadType: "application/json",
				source: "order-service", topic: "shop.order.events", version: 1, payload: `{"amount":42}`}
			if got != want {
				t.Errorf("stored %+v, want %+v", got, want)
			}
		})
	}
}

// A payload that is not application/json (plain text, or a vendor +json
// type) travels as the body in binary mode and as data_base64 in
// structured and batch mode (the client writes both by hand, without the
// CloudEvents SDK), and publish stores its bytes as they were.
func TestPublishAPayloadThatIsNotJSON(t *testing.T) {
	p := newPublish(t, nil)
	url := serve(t, p.handler)
	for _, payload := range []struct{ name, typ, body string }{
		{"text", "text/plain; charset=utf-8", "h\u00e9llo, {not json}"},
		// A +json type is JSON to the spec but not to the CloudEvents SDK
		// publish decodes with: it goes as data_base64, byte for byte.
		{"vendor-json", "application/vnd.shop.order+json", `{"orderId":"o-1","amount":42}`},
	} {
		for i, mode := range []client.Mode{client.ModeBinary, client.ModeStructured, client.ModeEnvelope} {
			for _, batch := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/batch=%v", payload.name, mode, batch), func(t *testing.T) {
					c := newClient(t, url, client.Options{Mode: mode, Source: "order-service"})
					e := order(fmt.Sprintf("%s-%d-%v", payload.name, i, batch), 1)
					e.PayloadType, e.Payload = payload.typ, []byte(payload.body)
					var err error
					if batch {
						_, err = c.PublishBatch(context.Background(), []*event.Event{e})
					} else {
						_, err = c.Publish(context.Background(), e)
					}
					if err != nil {
						t.Fatal(err)
					}
					got := p.row(t, e.ID)
					if got.payloadType != e.PayloadType || got.payload != string(e.Payload) {
						t.Errorf("stored %q as %q, want %q as %q", got.payload, got.payloadType, e.Payload, e.PayloadType)
					}
				})
			}
		}
	}
}

// A batch (CloudEvents batch mode, or an envelope array) is answered per
// event, in order; an event on a topic nobody consumes is skipped, the
// others written, and the skip comes back as a *SkippedError with the
// results.
func TestPublishBatch(t *testing.T) {
	p := newPublish(t, nil)
	url := serve(t, p.handler)
	for _, mode := range []client.Mode{client.ModeBinary, client.ModeEnvelope} {
		t.Run(string(mode), func(t *testing.T) {
			c := newClient(t, url, client.Options{Mode: mode, Source: "order-service"})
			before := p.rows(t)
			agg := "batch-" + string(mode)
			cart := &event.Event{Type: "cart.emptied", Topic: "shop.cart.events", AggregateID: agg, Version: 1, Payload: []byte(`{}`)}
			rs, err := c.PublishBatch(context.Background(), []*event.Event{order(agg, 1), cart, order(agg, 2)})
			var se *client.SkippedError
			if !errors.As(err, &se) || len(se.Skipped) != 1 || se.Skipped[0].EventID != cart.ID {
				t.Fatalf("err = %v, want a *SkippedError naming the cart event", err)
			}
			if len(rs) != 3 || rs[0].Status != client.StatusPending || rs[1].Status != client.StatusSkipped ||
				rs[2].Status != client.StatusPending || rs[2].Version != 2 {
				t.Fatalf("results %+v", rs)
			}
			if n := p.rows(t) - before; n != 2 {
				t.Errorf("%d rows written, want 2 (the skipped event is not written)", n)
			}
		})
	}
}

// The answer to the first request is lost after publish wrote the event
// (the connection is closed before any byte of it): the client sends the
// same request again, with the same event id, and publish recognizes it,
// so there is one event.
func TestRetryAfterALostAnswerWritesOneEvent(t *testing.T) {
	p := newPublish(t, nil)
	var requests atomic.Int32
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			rec := httptest.NewRecorder()
			p.handler.ServeHTTP(rec, r) // publish does its work...
			if rec.Code != http.StatusAccepted {
				t.Errorf("first request: publish answered %d: %s", rec.Code, rec.Body)
			}
			conn, _, err := w.(http.Hijacker).Hijack() // ...and its answer is lost
			if err != nil {
				t.Error(err)
				return
			}
			conn.Close()
			return
		}
		p.handler.ServeHTTP(w, r)
	}))
	for _, batch := range []bool{false, true} {
		requests.Store(0)
		before := p.rows(t)
		c := newClient(t, url, client.Options{Source: "order-service"})
		e := order(fmt.Sprintf("lost-%v", batch), 1)
		var (
			res client.Result
			err error
		)
		if batch {
			var rs []client.Result
			rs, err = c.PublishBatch(context.Background(), []*event.Event{e})
			if len(rs) == 1 {
				res = rs[0]
			}
		} else {
			res, err = c.Publish(context.Background(), e)
		}
		if err != nil {
			t.Fatalf("batch=%v: %v", batch, err)
		}
		if requests.Load() != 2 {
			t.Errorf("batch=%v: %d requests, want 2 (one lost answer, one retry)", batch, requests.Load())
		}
		if !res.Duplicate || res.EventID != e.ID {
			t.Errorf("batch=%v: result %+v, want the retry recognized as a duplicate of %s", batch, res, e.ID)
		}
		if n := p.rows(t) - before; n != 1 {
			t.Errorf("batch=%v: %d events written, want 1", batch, n)
		}
	}
}

// A 503 with Retry-After (publish's answer when every request slot is
// taken) is waited out and retried; a caller whose deadline ends before
// the wait gets the 503 at once, as an *APIError, with nothing written.
func TestRetryAfterBusy(t *testing.T) {
	p := newPublish(t, nil)
	var busy, requests atomic.Int32
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if busy.Add(-1) >= 0 {
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, `{"error":"busy","message":"publish is at its limit of requests in flight; nothing was written, retry after a second"}`)
			return
		}
		p.handler.ServeHTTP(w, r)
	}))
	c := newClient(t, url, client.Options{Source: "order-service"})

	busy.Store(1)
	start := time.Now()
	res, err := c.Publish(context.Background(), order("busy-1", 1))
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < time.Second {
		t.Errorf("retried after %v; Retry-After said 1s", waited)
	}
	if requests.Load() != 2 || res.Status != client.StatusPending {
		t.Errorf("%d requests, result %+v; want 2 and pending", requests.Load(), res)
	}

	busy.Store(1)
	requests.Store(0)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = c.Publish(ctx, order("busy-2", 1))
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusServiceUnavailable || ae.Code != "busy" {
		t.Fatalf("err = %v, want the 503 busy as an *APIError", err)
	}
	if requests.Load() != 1 {
		t.Errorf("%d requests; a wait past the deadline must not be started", requests.Load())
	}
	if p.rows(t) != 1 {
		t.Errorf("%d rows, want 1", p.rows(t))
	}
}

// Refusals come back as typed errors naming what was wrong, and none is
// retried.
func TestTypedErrors(t *testing.T) {
	p := newPublish(t, nil)
	var requests atomic.Int32
	count := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { requests.Add(1); h.ServeHTTP(w, r) })
	}
	c := newClient(t, serve(t, count(p.handler)), client.Options{Source: "order-service"})
	ctx := context.Background()

	bad := order(" ", 1)
	bad.Version = 0
	_, err := c.Publish(ctx, bad)
	var ie *client.InvalidError
	if !errors.As(err, &ie) || ie.StatusCode != http.StatusBadRequest || ie.Code != "invalid_event" {
		t.Fatalf("err = %v, want an *InvalidError", err)
	}
	for _, f := range []string{"aggregateId", "version"} {
		if p, ok := ie.Field(f); !ok || p.Rule == "" {
			t.Errorf("field %s: not named with its rule in %+v", f, ie.Fields)
		}
	}

	rs, err := c.PublishBatch(ctx, []*event.Event{order("ok", 1), order("", 1)})
	if !errors.As(err, &ie) || rs != nil {
		t.Fatalf("batch: err = %v, results %v; want an *InvalidError and no results", err, rs)
	}
	if p, ok := ie.Field("aggregateId"); !ok || p.Index == nil || *p.Index != 1 {
		t.Errorf("batch: the problem must name event 1: %+v", ie.Fields)
	}

	first := order("conflict", 1)
	if _, err := c.Publish(ctx, first); err != nil {
		t.Fatal(err)
	}
	_, err = c.Publish(ctx, order("conflict", 1))
	var ce *client.ConflictError
	if !errors.As(err, &ce) || ce.StatusCode != http.StatusConflict {
		t.Fatalf("err = %v, want a *ConflictError", err)
	}

	_, err = c.Publish(ctx, &event.Event{Type: "cart.emptied", Topic: "shop.cart.events", AggregateID: "c-1", Version: 1, Payload: []byte(`{}`)})
	var se *client.SkippedError
	if !errors.As(err, &se) || se.Skipped[0].Topic != "shop.cart.events" {
		t.Fatalf("err = %v, want a *SkippedError", err)
	}

	authed := newPublish(t, func(o *publish.Options) { o.Auth, o.OnCloudRun = publish.AuthCloudRun, true })
	ac := newClient(t, serve(t, count(authed.handler)), client.Options{Source: "order-service"})
	_, err = ac.Publish(ctx, order("auth", 1))
	var ae *client.AuthError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusUnauthorized || ae.Code != "unauthenticated" {
		t.Fatalf("err = %v, want an *AuthError 401", err)
	}

	if n := requests.Load(); n != 6 {
		t.Errorf("%d requests for 6 calls: a refusal must not be retried", n)
	}
	if n := p.rows(t) + authed.rows(t); n != 1 {
		t.Errorf("%d rows, want 1 (only the first conflict event)", n)
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	for _, c := range []struct {
		endpoint string
		mode     client.Mode
	}{{"localhost:8080", ""}, {"ftp://x", ""}, {"http://x", "protobuf"}} {
		if _, err := client.New(c.endpoint, client.Options{Mode: c.mode}); err == nil {
			t.Errorf("New(%q, %q) accepted", c.endpoint, c.mode)
		}
	}
}
