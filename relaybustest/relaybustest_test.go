package relaybustest_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/sourcecontextpb"

	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/relaybustest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/relay"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// OrderV1 is order.purchased v1's payload.
type OrderV1 struct {
	MemberID string  `json:"memberId"`
	Amount   float64 `json:"amount"`
}

// OrderV2 is v2's: the amount in cents, with its currency.
type OrderV2 struct {
	MemberID    string `json:"memberId"`
	AmountCents int64  `json:"amountCents"`
	Currency    string `json:"currency"`
}

// createPoints is the handler's own table: each member's points, and the
// events applied to it, in the order they were.
func createPoints(ctx context.Context, db *pgxpool.Pool) error {
	_, err := db.Exec(ctx, `CREATE TABLE member_points (member_id text PRIMARY KEY, points bigint NOT NULL,
		version bigint NOT NULL, applied text[] NOT NULL)`)
	return err
}

// points is a consumer of order.purchased in the schema versions given:
// it adds the amount in points to the member and emits points.added.
func points(versions ...string) *consumer.Mux {
	mux := consumer.NewMux()
	add := func(ctx context.Context, c *consumer.Context, member string, pts int64) error {
		var version int64
		if err := c.Tx.QueryRow(ctx, `INSERT INTO member_points VALUES ($1, $2, 1, ARRAY[$3])
			ON CONFLICT (member_id) DO UPDATE SET points = member_points.points + EXCLUDED.points,
			version = member_points.version + 1, applied = member_points.applied || EXCLUDED.applied
			RETURNING version`, member, pts, c.Event.ID).Scan(&version); err != nil {
			return consumer.Transient("database", err)
		}
		return c.Emit(ctx, relaybustest.NewEvent("member.points.events", "points.added", member, version,
			map[string]any{"points": pts}))
	}
	for _, v := range versions {
		switch v {
		case "v1":
			consumer.Register(mux, "order.purchased", "v1", func(ctx context.Context, c *consumer.Context, o OrderV1) error {
				return add(ctx, c, o.MemberID, int64(o.Amount))
			})
		case "v2":
			consumer.Register(mux, "order.purchased", "v2", func(ctx context.Context, c *consumer.Context, o *OrderV2) error {
				return add(ctx, c, o.MemberID, o.AmountCents/100)
			})
		}
	}
	return mux
}

func kit(t *testing.T, h consumer.Handler) *relaybustest.Kit {
	return relaybustest.New(t, h, relaybustest.Options{ConsumerID: "member-service", DatabaseURL: pgtest.URL(t),
		Migrate: createPoints, Emits: []string{"member.points.events"}})
}

func purchased(orderID string, version int64, o any) *event.Event {
	return relaybustest.NewEvent("shop.order.events", "order.purchased", orderID, version, o)
}

// member returns a member's points and the events applied to them.
func member(t *testing.T, k *relaybustest.Kit, id string) (int64, []string) {
	t.Helper()
	var (
		pts     int64
		applied []string
	)
	err := k.DB.QueryRow(context.Background(), `SELECT points, applied FROM member_points WHERE member_id = $1`, id).Scan(&pts, &applied)
	if err != nil {
		t.Fatalf("member %s: %v", id, err)
	}
	return pts, applied
}

func outcomes(rs []consumer.Result) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = string(r.Outcome)
		if r.Duplicate {
			out[i] = "duplicate"
		}
	}
	return out
}

// Two orders delivered in order, then the first again: applied once each,
// the repeat a duplicate with no effect; each emitted one child event that
// names its order as parent.
func TestDeliverInOrderAndTwice(t *testing.T) {
	k := kit(t, points("v1"))
	e1 := purchased("o-1", 1, OrderV1{MemberID: "m-1", Amount: 42})
	e2 := purchased("o-2", 1, OrderV1{MemberID: "m-1", Amount: 8})
	rs := k.Deliver(e1, e2, e1)
	if got := outcomes(rs); !slices.Equal(got, []string{"success", "success", "duplicate"}) {
		t.Fatalf("outcomes %v", got)
	}
	if pts, applied := member(t, k, "m-1"); pts != 50 || !slices.Equal(applied, []string{e1.ID, e2.ID}) {
		t.Errorf("m-1: %d points from %v, want 50 from the two orders", pts, applied)
	}
	em := k.Emitted()
	if len(em) != 2 || em[0].ParentEventID != e1.ID || em[1].ParentEventID != e2.ID ||
		em[1].Topic != "member.points.events" || em[1].Version != 2 || em[1].TraceID != e2.TraceID {
		for _, e := range em {
			t.Logf("emitted %s %s v%d parent %s trace %s", e.ID, e.Topic, e.Version, e.ParentEventID, e.TraceID)
		}
		t.Fatalf("emitted: want points.added v1, v2 with parents %s, %s and trace %s", e1.ID, e2.ID, e2.TraceID)
	}
}

// One aggregate's versions delivered out of order to a strict consumer: the
// early one is parked and applied once its predecessor is, so the handler
// sees them in order.
func TestDeliverOutOfOrderToAStrictConsumer(t *testing.T) {
	k := kit(t, projection.Strict(points("v1")))
	e1 := purchased("o-1", 1, OrderV1{MemberID: "m-1", Amount: 1})
	e2 := purchased("o-1", 2, OrderV1{MemberID: "m-1", Amount: 2})
	e3 := purchased("o-1", 3, OrderV1{MemberID: "m-1", Amount: 3})
	rs := k.Deliver(e3, e1, e2, e3)
	if got := outcomes(rs); !slices.Equal(got, []string{"parked", "success", "success", "duplicate"}) {
		t.Fatalf("outcomes %v", got)
	}
	if pts, applied := member(t, k, "m-1"); pts != 6 || !slices.Equal(applied, []string{e1.ID, e2.ID, e3.ID}) {
		t.Errorf("m-1: %d points, applied %v; want 6, in version order", pts, applied)
	}
	if n := len(k.Emitted()); n != 3 {
		t.Errorf("%d child events, want 3", n)
	}
}

// A payload that does not fit the handler's type is poison: acknowledged,
// dead-lettered, the error naming the field; the handler never runs. A
// schema version the consumer does not read is poison too.
func TestUndecodableAndUnknownVersionArePoison(t *testing.T) {
	k := kit(t, points("v1"))
	bad := purchased("o-1", 1, map[string]any{"memberId": 7, "amount": 1})
	v3 := purchased("o-2", 1, OrderV1{MemberID: "m-1", Amount: 1})
	v3.SchemaVersion = "v3"
	rs := k.Deliver(bad, v3)
	if rs[0].Outcome != model.OutcomePoison || rs[0].Code != "bad_payload" || !strings.Contains(rs[0].Error, "payload.memberId") {
		t.Errorf("bad payload: %+v; want poison bad_payload naming payload.memberId", rs[0])
	}
	if rs[1].Outcome != model.OutcomePoison || rs[1].Code != "no_handler" || !strings.Contains(rs[1].Error, "unknown schema version: this consumer reads v1") {
		t.Errorf("v3: %+v; want poison no_handler naming the versions read", rs[1])
	}
	dl := k.DeadLetters()
	if len(dl) != 2 || dl[0].Topic != "shop.order.events.dlq" || dl[0].Reason() != "bad_payload" || dl[1].Reason() != "no_handler" {
		t.Errorf("dead letters %+v", dl)
	}
	var n int
	if err := k.DB.QueryRow(context.Background(), `SELECT count(*) FROM member_points`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d members written (%v), want none", n, err)
	}
}

// A protobuf type receives a protobuf payload (binary, or protobuf's JSON
// mapping), and a payload that is not one is poison naming the field.
func TestTypedProtobufHandler(t *testing.T) {
	mux := consumer.NewMux()
	var got []string
	consumer.Register(mux, "file.changed", "v1", func(_ context.Context, _ *consumer.Context, s *sourcecontextpb.SourceContext) error {
		got = append(got, s.GetFileName())
		return nil
	})
	k := relaybustest.New(t, mux, relaybustest.Options{DatabaseURL: pgtest.URL(t)})
	bin := relaybustest.NewEvent("repo.file.events", "file.changed", "f-1", 1, &sourcecontextpb.SourceContext{FileName: "a.proto"})
	js := relaybustest.NewEvent("repo.file.events", "file.changed", "f-1", 2, []byte(`{"fileName":"b.proto","addedLater":1}`))
	bad := relaybustest.NewEvent("repo.file.events", "file.changed", "f-1", 3, []byte(`{"fileName":5}`))
	rs := k.Deliver(bin, js, bad)
	if got := outcomes(rs); !slices.Equal(got, []string{"success", "success", "poison"}) {
		t.Fatalf("outcomes %v (%+v)", got, rs)
	}
	if !slices.Equal(got, []string{"a.proto", "b.proto"}) {
		t.Errorf("handler got %v", got)
	}
	if !strings.Contains(rs[2].Error, "fileName") {
		t.Errorf("the poison's error must name the field: %s", rs[2].Error)
	}
}

// v1 and v2 of one change, enqueued in one transaction, are published by
// the relay in aggregate order (v2 first) and applied once by every consumer: in v1 by
// one that reads v1 only, in v2 by one that reads v2 or both, whatever the
// order of delivery to a strict consumer, and once (in the first version
// delivered) by a plain consumer that gets them out of order. Every
// delivery is acknowledged as a success, so each version's event is
// consumed in the ledger.
func TestTwoVersionsOfOneChangeSideBySide(t *testing.T) {
	ctx := context.Background()
	producer := pgtest.Schema(t)
	if err := outbox.Migrate(ctx, producer); err != nil {
		t.Fatal(err)
	}
	change := &event.Event{ID: "order-7-purchased", Type: "order.purchased", Topic: "shop.order.events",
		Source: "order-service", AggregateID: "o-7", Version: 1}
	evs, err := event.SideBySide(change,
		event.Encoded{SchemaVersion: "v1", Payload: []byte(`{"memberId":"m-7","amount":42}`)},
		event.Encoded{SchemaVersion: "v2", Payload: []byte(`{"memberId":"m-7","amountCents":4200,"currency":"EUR"}`)})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := producer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx, tx, evs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// The relay publishes them, in aggregate order, as one ordered batch.
	pub := &capture{}
	r, err := relay.New(relay.Options{DB: producer, Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Drain(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	var published []*event.Event
	for _, m := range pub.msgs {
		e, _, err := event.Decode(m, event.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		published = append(published, &e)
	}
	if len(published) != 2 || published[0].ID != "order-7-purchased.v2" || published[0].Version != 1 ||
		published[1].ID != "order-7-purchased.v1" || published[1].Version != 2 ||
		published[0].TraceID != published[1].TraceID || published[0].SpanID != published[1].SpanID {
		t.Fatalf("the relay published %+v; want v2 at version 1 then v1 at version 2, one trace and span", published)
	}
	v2, v1 := published[0], published[1]
	for _, c := range []struct {
		name    string
		handler consumer.Handler
		order   []*event.Event
		want    string // the one event applied
	}{
		{"reads v1", points("v1"), []*event.Event{v2, v1}, v1.ID},
		{"reads v2", points("v2"), []*event.Event{v2, v1}, v2.ID},
		{"reads both", points("v1", "v2"), []*event.Event{v2, v1}, v2.ID},
		{"reads both, strict, reordered", projection.Strict(points("v1", "v2")), []*event.Event{v1, v2}, v2.ID},
		{"reads both, reordered", points("v1", "v2"), []*event.Event{v1, v2}, v1.ID},
		{"reads v1, reordered", points("v1"), []*event.Event{v1, v2}, v1.ID},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := kit(t, c.handler)
			rs := k.Deliver(c.order...)
			for i, r := range rs {
				if r.Status != 200 || (r.Outcome != model.OutcomeSuccess && r.Outcome != model.OutcomeParked) {
					t.Errorf("delivery %d (%s): %+v", i, c.order[i].ID, r)
				}
			}
			if pts, applied := member(t, k, "m-7"); pts != 42 || !slices.Equal(applied, []string{c.want}) {
				t.Errorf("m-7: %d points from %v; want 42, from %s alone", pts, applied, c.want)
			}
			if n := len(k.Emitted()); n != 1 {
				t.Errorf("%d child events, want 1", n)
			}
		})
	}
}

// capture is the relay's Pub/Sub: it keeps what was published, in order.
type capture struct {
	mu   sync.Mutex
	msgs []event.Message
}

func (c *capture) PublishBatch(_ context.Context, topic string, msgs []event.Message) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		m.Topic = topic
		c.msgs = append(c.msgs, m)
	}
	return len(msgs), nil
}

func TestSideBySideRefusesBadVersions(t *testing.T) {
	for _, vs := range [][]event.Encoded{
		nil,
		{{SchemaVersion: "2"}},
		{{SchemaVersion: "v1"}, {SchemaVersion: "v1"}},
	} {
		if _, err := event.SideBySide(&event.Event{}, vs...); err == nil {
			t.Errorf("%v accepted", vs)
		} else if fe := event.FieldErrors(err); len(fe) != 1 || fe[0].Field != "schemaVersion" {
			t.Errorf("%v: %v, want a schemaVersion field error", vs, err)
		}
	}
}
