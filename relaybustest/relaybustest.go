// Package relaybustest tests a consumer's handler in a few lines, against
// a real Postgres and the real consume engine (shared/consumer, with its
// inbox, attempt log and outbox), as River's rivertest and Watermill's
// gochannel let their users test theirs. Each Kit gets a schema of its
// own, migrated as the consume function migrates a consumer's database,
// and dropped when the test ends.
//
//	func TestPoints(t *testing.T) {
//		k := relaybustest.New(t, points.Handler(), relaybustest.Options{ConsumerID: "member-service"})
//		e1 := relaybustest.NewEvent("shop.order.events", "order.purchased", "o-1", 1, Order{MemberID: "m-1", Amount: 42})
//		e2 := relaybustest.NewEvent("shop.order.events", "order.purchased", "o-1", 2, Order{MemberID: "m-1", Amount: 8})
//		rs := k.Deliver(e2, e1, e1) // out of order, then twice
//		// assert rs[i].Outcome / rs[2].Duplicate, the handler's rows (k.DB), k.Emitted(), k.DeadLetters()
//	}
//
// Events are delivered as Pub/Sub delivers them to the consume function:
// encoded as a message (CloudEvents structured JSON, relaybus's attributes,
// the aggregate id as ordering key), one delivery at a time, in the order
// given, with Pub/Sub's delivery attempt counting each redelivery of an
// event. Order, reordering and repeats are the test's to choose; the
// engine's answer to each (consumer.Result: applied, duplicate, parked,
// failed, poison, or a 503 asking for a redelivery) is returned.
//
// The database is the first of Options.DatabaseURL,
// $RELAYBUS_TEST_DATABASE_URL (what relaybus's testenv starts) and
// $DATABASE_URL; with none, the test fails saying so.
package relaybustest

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/projection"
)

// DefaultConsumerID is the consumer a Kit runs as when Options name none.
const DefaultConsumerID = "test-service"

// Options configure a Kit. Every field is optional.
type Options struct {
	// ConsumerID names the consumer under test (DefaultConsumerID).
	ConsumerID string
	// DatabaseURL is the Postgres server to test on; see the package
	// documentation for the default.
	DatabaseURL string
	// Migrate creates the handler's own tables in the test's schema, after
	// relaybus's (inbox, projections, outbox). A handler with a Migrate
	// method (functions/consume's Migrator) is migrated without it.
	Migrate func(ctx context.Context, db *pgxpool.Pool) error
	// Emits are the topics the handler may emit to (nil: any), as the
	// topology's emits of the consumer.
	Emits []string
	// MaxDeliveryAttempts is the subscription's dead-letter threshold
	// (consumer.DefaultMaxDeliveryAttempts).
	MaxDeliveryAttempts int
}

// Kit runs one handler on the consume engine over a schema of its own.
type Kit struct {
	// DB is the test's schema: the handler's tables, the inbox, the
	// attempt log and the outbox. Assert projections with it.
	DB *pgxpool.Pool
	// Engine is the consume engine running the handler.
	Engine *consumer.Engine

	t           testing.TB
	consumerID  string
	deadLetters *deadLetters
	mu          sync.Mutex
	attempts    map[string]int
}

// migrator is a handler with tables of its own (functions/consume's Migrator).
type migrator interface {
	Migrate(ctx context.Context, db migrate.Beginner) error
}

// New returns a Kit running h as a consumer on a fresh schema.
func New(t testing.TB, h consumer.Handler, o Options) *Kit {
	t.Helper()
	if o.ConsumerID == "" {
		o.ConsumerID = DefaultConsumerID
	}
	url := o.DatabaseURL
	for _, env := range []string{"RELAYBUS_TEST_DATABASE_URL", "DATABASE_URL"} {
		if url == "" {
			url = os.Getenv(env)
		}
	}
	if url == "" {
		t.Fatal("relaybustest: no Postgres: set Options.DatabaseURL, $RELAYBUS_TEST_DATABASE_URL or $DATABASE_URL (or run the tests under relaybus's go run ./internal/cmd/testenv)")
	}
	ctx := context.Background()
	// A schema of its own, dropped when t ends.
	pool, _ := pgtest.SchemaOn(t, url, "relaybustest", func(c *pgxpool.Config) { c.MaxConns = 4 })
	for _, l := range []migrate.Line{inbox.Migrations, projection.Migrations, outbox.Migrations} {
		if _, err := l.Apply(ctx, pool); err != nil {
			t.Fatalf("relaybustest: migrate %s: %v", l.Name, err)
		}
	}
	if m, ok := h.(migrator); ok {
		if err := m.Migrate(ctx, pool); err != nil {
			t.Fatalf("relaybustest: the handler's Migrate: %v", err)
		}
	}
	if o.Migrate != nil {
		if err := o.Migrate(ctx, pool); err != nil {
			t.Fatalf("relaybustest: Options.Migrate: %v", err)
		}
	}
	dl := &deadLetters{}
	eng, err := consumer.New(consumer.Options{DB: pool, ConsumerID: o.ConsumerID, Handler: h, DeadLetters: dl,
		Emits: o.Emits, MaxDeliveryAttempts: o.MaxDeliveryAttempts})
	if err != nil {
		t.Fatalf("relaybustest: %v", err)
	}
	return &Kit{DB: pool, Engine: eng, t: t, consumerID: o.ConsumerID, deadLetters: dl, attempts: map[string]int{}}
}

// Deliver delivers each event once, one after the other, in the order
// given (repeat an event to deliver it twice), and returns the engine's
// result for each. A redelivery of an event carries the same message id
// and the next delivery attempt, as Pub/Sub's does.
func (k *Kit) Deliver(events ...*event.Event) []consumer.Result {
	k.t.Helper()
	rs := make([]consumer.Result, len(events))
	for i, e := range events {
		if e.TraceID == "" {
			e.TraceID = event.NewTraceID() // as every send path does
		}
		m, err := cloudevent.Encode(e, event.EncodingJSON)
		if err != nil {
			k.t.Fatalf("relaybustest: encode event %s: %v", e.ID, err)
		}
		k.mu.Lock()
		k.attempts[e.ID]++
		n := k.attempts[e.ID]
		k.mu.Unlock()
		m.ID = "m-" + e.ID
		m.Topic = e.Topic
		m.DeliveryAttempt = n
		m.PublishTime = time.Now()
		sub := e.Topic + "." + k.consumerID + "-sub"
		if names.ValidateSubscription(sub) != nil {
			sub = ""
		}
		rs[i] = k.Engine.Handle(context.Background(), delivery.Delivery{Mode: delivery.ModePush, Subscription: sub, Message: m})
	}
	return rs
}

// Emitted returns the events in the consumer's outbox, in the order they
// were enqueued: the child events its handler emitted (and any event the
// test enqueued there itself).
func (k *Kit) Emitted() []*event.Event {
	k.t.Helper()
	evs, err := Outbox(context.Background(), k.DB)
	if err != nil {
		k.t.Fatalf("relaybustest: %v", err)
	}
	return evs
}

//go:embed sql/outbox.sql
var outboxSQL string

// Outbox returns the events in db's outbox in the order they were
// enqueued (a producer's own outbox, to hand its events to Deliver).
func Outbox(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}) ([]*event.Event, error) {
	rows, err := db.Query(ctx, outboxSQL)
	if err != nil {
		return nil, fmt.Errorf("read the outbox: %w", err)
	}
	defer rows.Close()
	var out []*event.Event
	for rows.Next() {
		var (
			e         event.Event
			initiator []byte
			expire    *time.Time
		)
		if err := rows.Scan(&e.ID, &e.Type, &e.Source, &e.Topic, &e.AggregateType, &e.AggregateID, &e.Version,
			&e.OccurredAt, &e.SchemaVersion, &e.PayloadType, &e.Payload, &e.TraceID, &e.SpanID, &e.ParentEventID,
			&e.CorrelationID, &initiator, &expire); err != nil {
			return nil, fmt.Errorf("read the outbox: %w", err)
		}
		if len(initiator) > 0 {
			_ = json.Unmarshal(initiator, &e.Initiator)
		}
		if expire != nil {
			e.ExpireAt = *expire
		}
		e.OccurredAt = e.OccurredAt.UTC()
		out = append(out, &e)
	}
	return out, rows.Err()
}

// DeadLetter is a message the engine dead-lettered.
type DeadLetter struct {
	// Topic is the dead-letter topic (<topic>.dlq).
	Topic string
	// Message is the dead letter: the original data and attributes plus
	// the reason (deadletter's attributes).
	Message event.Message
}

// Reason is the dead letter's reason (bad_payload, no_handler, ...).
func (d DeadLetter) Reason() string { return d.Message.Attributes[deadletter.AttrReason] }

// DeadLetters returns the messages the engine published to dead-letter
// topics (poison: undecodable, no handler for the type or its schema
// version).
func (k *Kit) DeadLetters() []DeadLetter {
	k.deadLetters.mu.Lock()
	defer k.deadLetters.mu.Unlock()
	return append([]DeadLetter(nil), k.deadLetters.msgs...)
}

// deadLetters is the engine's dead-letter publisher: it keeps them.
type deadLetters struct {
	mu   sync.Mutex
	msgs []DeadLetter
}

func (d *deadLetters) Publish(_ context.Context, topic string, m event.Message) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.msgs = append(d.msgs, DeadLetter{Topic: topic, Message: m})
	return fmt.Sprintf("dl-%d", len(d.msgs)), nil
}

// NewEvent returns a valid event for a test: a new id, source
// "relaybustest", now as occurredAt, and payload as its payload: a
// proto.Message in protobuf's binary encoding (application/protobuf),
// []byte as is (JSON), anything else as JSON. It has no trace id, so a
// child event built with it inherits its parent's when emitted; Deliver
// gives a delivered event one.
func NewEvent(topic, eventType, aggregateID string, version int64, payload any) *event.Event {
	e := &event.Event{ID: event.NewID(), Type: eventType, Source: "relaybustest", Topic: topic,
		AggregateID: aggregateID, Version: version, OccurredAt: time.Now().UTC()}
	switch p := payload.(type) {
	case proto.Message:
		b, err := proto.Marshal(p)
		if err != nil {
			panic(fmt.Sprintf("relaybustest: marshal the payload: %v", err))
		}
		e.Payload, e.PayloadType = b, "application/protobuf"
	case []byte:
		e.Payload = p
	default:
		b, err := json.Marshal(p)
		if err != nil {
			panic(fmt.Sprintf("relaybustest: marshal the payload: %v", err))
		}
		e.Payload = b
	}
	e.Normalize()
	return e
}
