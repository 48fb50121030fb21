package relaybustest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/relaybustest"
	"github.com/relaybus/relaybus/shared/consumer"
)

// A handler tested in a few lines: deliver an order, then the same order
// again, and look at what the consumer wrote and emitted. In a test, pass
// the test's t; DatabaseURL defaults to $RELAYBUS_TEST_DATABASE_URL, then
// $DATABASE_URL.
func Example() {
	t := &exampleT{}
	defer t.cleanup()

	mux := consumer.NewMux()
	consumer.Register(mux, "order.purchased", "v1", func(ctx context.Context, c *consumer.Context, o OrderV1) error {
		_, err := c.Tx.Exec(ctx, `INSERT INTO member_points VALUES ($1, $2, 1, ARRAY[$3])`, o.MemberID, int64(o.Amount), c.Event.ID)
		if err != nil {
			return err
		}
		return c.Emit(ctx, relaybustest.NewEvent("member.points.events", "points.added", o.MemberID, 1, map[string]any{"points": o.Amount}))
	})
	k := relaybustest.New(t, mux, relaybustest.Options{ConsumerID: "member-service", DatabaseURL: pgtest.URL(t), Migrate: createPoints})

	order := relaybustest.NewEvent("shop.order.events", "order.purchased", "o-1", 1, OrderV1{MemberID: "m-1", Amount: 42})
	for _, r := range k.Deliver(order, order) {
		if r.Duplicate {
			fmt.Println("delivery: duplicate, nothing done")
			continue
		}
		fmt.Println("delivery:", r.Outcome)
	}
	var pts int
	_ = k.DB.QueryRow(context.Background(), `SELECT points FROM member_points WHERE member_id = 'm-1'`).Scan(&pts)
	fmt.Println("points:", pts)
	for _, e := range k.Emitted() {
		fmt.Println("emitted:", e.Type, e.Topic, "parent is the order:", e.ParentEventID == order.ID)
	}
	// Output:
	// delivery: success
	// delivery: duplicate, nothing done
	// points: 42
	// emitted: points.added member.points.events parent is the order: true
}

// exampleT stands in for a test's *testing.T in the Example: it panics on
// a failure and runs the cleanups at the end.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func (*exampleT) Helper()                   {}
func (*exampleT) Name() string              { return "Example" }
func (e *exampleT) Cleanup(f func())        { e.cleanups = append(e.cleanups, f) }
func (*exampleT) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (*exampleT) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (e *exampleT) cleanup() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}
