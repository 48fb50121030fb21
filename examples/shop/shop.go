// Package shop holds the demo's consumers (the purchase scenario: one
// order.purchased event, two consumers; docs/local-stack.md "make demo"), registered with the consume function by name:
//
//   - example.points (member-service): an order.purchased adds its amount in
//     points to the member's balance and emits points.added on
//     member.points.events (aggregate: the member);
//   - example.notify (message-service): an order.purchased records a
//     notification and emits notification.sent on
//     message.notification.events (aggregate: the order). When the order's
//     payload has "failFirstNotify": true, its first attempt fails
//     transiently, so the demo shows a redelivery; with
//     "failNotifyAttempts": n its first n attempts fail (past the
//     subscription's maximum, Pub/Sub dead-letters it: the console's browser
//     test replays it).
//
// Both emit their child events through the consumer's outbox in the same
// transaction, so the children share the order's trace and name it as
// their parent.
package shop

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrations is the demo tables' migration line.
var Migrations = migrate.MustLoadFS("shop", migrationFS, "migrations")

// Order is an order.purchased payload.
type Order struct {
	OrderID         string  `json:"orderId"`
	MemberID        string  `json:"memberId"`
	Amount          float64 `json:"amount"`
	FailFirstNotify bool    `json:"failFirstNotify"`
	// FailNotifyAttempts makes message-service's first n attempts fail.
	FailNotifyAttempts int `json:"failNotifyAttempts"`
}

func order(c *consumer.Context) (Order, error) {
	var o Order
	if err := json.Unmarshal(c.Event.Payload, &o); err != nil {
		return o, consumer.Poison("bad_payload", fmt.Errorf("order.purchased payload: %w", err))
	}
	if o.MemberID == "" {
		return o, consumer.Permanent("no_member", errors.New("order.purchased payload: memberId is required"))
	}
	if o.OrderID == "" {
		o.OrderID = c.Event.AggregateID
	}
	return o, nil
}

type handler struct {
	consumer.Handler
	tables []string
}

// Migrate creates the demo tables; consume calls it at start.
func (handler) Migrate(ctx context.Context, db migrate.Beginner) error {
	_, err := Migrations.Apply(ctx, db)
	return err
}

// Tables names the demo table the handler uses (consume.TableOwner): the
// deploy's migrate step grants its consumer's role that one only.
func (h handler) Tables() []string { return h.tables }

// Points is member-service's handler.
func Points() consumer.Handler {
	mux := consumer.NewMux()
	mux.RegisterFunc("order.purchased", consumer.Any, func(ctx context.Context, c *consumer.Context) error {
		o, err := order(c)
		if err != nil {
			return err
		}
		points := int64(math.Floor(o.Amount))
		var balance, version int64
		if err := c.Tx.QueryRow(ctx, `INSERT INTO shop_member_points (member_id, points, version) VALUES ($1, $2, 1)
			ON CONFLICT (member_id) DO UPDATE SET points = shop_member_points.points + EXCLUDED.points,
			version = shop_member_points.version + 1, updated_at = now()
			RETURNING points, version`, o.MemberID, points).Scan(&balance, &version); err != nil {
			return consumer.Transient("database", err)
		}
		payload, _ := json.Marshal(map[string]any{"memberId": o.MemberID, "orderId": o.OrderID, "points": points, "balance": balance})
		return c.Emit(ctx, &event.Event{Type: "points.added", Topic: "member.points.events", AggregateType: "member",
			AggregateID: o.MemberID, Version: version, Payload: payload})
	})
	return handler{mux, []string{"shop_member_points"}}
}

// Notify is message-service's handler.
func Notify() consumer.Handler {
	mux := consumer.NewMux()
	mux.RegisterFunc("order.purchased", consumer.Any, func(ctx context.Context, c *consumer.Context) error {
		o, err := order(c)
		if err != nil {
			return err
		}
		if o.FailFirstNotify && c.Attempt == 1 {
			return consumer.Transient("demo_first_attempt", errors.New("the notification gateway timed out (the demo's planned first failure)"))
		}
		if c.Attempt <= o.FailNotifyAttempts {
			return consumer.Transient("demo_gateway_down", fmt.Errorf("the notification gateway is down (planned failure %d of %d)", c.Attempt, o.FailNotifyAttempts))
		}
		if _, err := c.Tx.Exec(ctx, `INSERT INTO shop_notifications (event_id, order_id, member_id) VALUES ($1, $2, $3)`,
			c.Event.ID, o.OrderID, o.MemberID); err != nil {
			return consumer.Transient("database", err)
		}
		payload, _ := json.Marshal(map[string]any{"memberId": o.MemberID, "orderId": o.OrderID, "channel": "email"})
		return c.Emit(ctx, &event.Event{Type: "notification.sent", Topic: "message.notification.events",
			AggregateType: "notification", AggregateID: c.Event.AggregateID, Version: c.Event.Version, Payload: payload})
	})
	return handler{mux, []string{"shop_notifications"}}
}

func init() {
	consume.RegisterHandler("example.points", func(consume.HandlerConfig) (consumer.Handler, error) { return Points(), nil })
	consume.RegisterHandler("example.notify", func(consume.HandlerConfig) (consumer.Handler, error) { return Notify(), nil })
}
