package query

import (
	"context"
	"os"
	"testing"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
)

func TestMain(m *testing.M) {
	code := m.Run()
	emutest.Cleanup()
	os.Exit(code)
}

const orderTopic = "shop.order.events"

// fieldErrs returns the fields named by the *event.FieldErrors in err.
func fieldErrs(err error) []string {
	var out []string
	for _, fe := range event.FieldErrors(err) {
		out = append(out, fe.Field)
	}
	return out
}

// testStore is the ledger's write path, this package's reader and the
// registry on one client, so a test writes and reads through one value.
type testStore struct {
	*ledger.Store
	*Reader
	*consumers.Registry
}

// newStore returns a store on a Firestore emulator project of its own.
func newStore(t testing.TB, opts ledger.Options) *testStore {
	t.Helper()
	c, err := firestore.NewClientWithDatabase(context.Background(), emutest.FirestoreProject(t), ledger.DefaultDatabase)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &testStore{Store: ledger.New(c, opts), Reader: New(c), Registry: consumers.New(c, consumers.Options{Now: opts.Now})}
}

// seed registers consumers for a topic in topic_consumers.
func seed(t testing.TB, s *testStore, topic string, consumers ...string) {
	t.Helper()
	var cs []registry.Consumer
	for i, c := range consumers {
		cs = append(cs, registry.Consumer{Topic: topic, ConsumerID: c, Enabled: true, SortOrder: i + 1})
	}
	if _, err := s.SyncConsumers(context.Background(), cs, consumersSync); err != nil {
		t.Fatal(err)
	}
}

var consumersSync = consumers.SyncOptions{}

// newEventOn returns a prepared event on topic.
func newEventOn(t testing.TB, topic, typ string, at time.Time) *event.Event {
	t.Helper()
	e := &event.Event{
		Type: typ, Topic: topic, AggregateID: "agg-" + event.NewID()[:8], Version: 1,
		Payload: []byte(`{"orderId":"ORD-2024-002","amount":199.0}`), OccurredAt: at,
		Initiator: event.Initiator{Service: "order-service", Operation: "confirmOrder", UserID: "user-A"},
	}
	if err := e.Prepare(at, event.Limits{}); err != nil {
		t.Fatal(err)
	}
	return e
}

func attempt(e *event.Event, consumer string, n int, o model.Outcome) model.Attempt {
	return model.Attempt{EventID: e.ID, ConsumerID: consumer, AttemptNo: n, Success: o == model.OutcomeSuccess, Outcome: o, Topic: e.Topic}
}
