package ledger

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/fscount"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Cleanup()
	emutest.Cleanup()
	os.Exit(code)
}

// fieldErrs returns the fields named by the *event.FieldErrors in err.
func fieldErrs(err error) []string {
	var out []string
	for _, fe := range event.FieldErrors(err) {
		out = append(out, fe.Field)
	}
	return out
}

// testClock is a settable clock.
type testClock struct{ t time.Time }

func (c *testClock) now() time.Time { return c.t }

// testStore is a store with the ledger's read side and registry on its
// client, so a test writes and reads through one value.
type testStore struct {
	*Store
	*query.Reader
	*consumers.Registry
}

// withReaders adds the reader and the registry on s's client to s.
func withReaders(s *Store) *testStore {
	return &testStore{Store: s, Reader: query.New(s.Client()), Registry: consumers.New(s.Client(), consumers.Options{Now: s.now})}
}

// newStore returns a store on a Firestore emulator project of its own.
func newStore(t testing.TB, opts Options) *testStore {
	t.Helper()
	return newStores(t, 1, opts)[0]
}

// newStores returns n stores with their own clients on one emulator
// project: n instances of a function sharing the ledger.
func newStores(t testing.TB, n int, opts Options) []*testStore {
	t.Helper()
	stores, _ := newCountedStores(t, n, opts)
	return stores
}

// newCountedStore returns a store on a project of its own and the counter
// of the reads and writes its client's RPCs carry.
func newCountedStore(t testing.TB, opts Options) (*testStore, *fscount.Counter) {
	t.Helper()
	stores, counters := newCountedStores(t, 1, opts)
	return stores[0], counters[0]
}

// newCountedStores is newStores with a counter of the RPCs per store.
func newCountedStores(t testing.TB, n int, opts Options) ([]*testStore, []*fscount.Counter) {
	t.Helper()
	project := emutest.FirestoreProject(t)
	out := make([]*testStore, n)
	counters := make([]*fscount.Counter, n)
	for i := range out {
		counters[i] = new(fscount.Counter)
		c, err := firestore.NewClientWithDatabase(context.Background(), project, DefaultDatabase, counters[i].Options()...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		out[i] = withReaders(New(c, opts))
	}
	return out, counters
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

// consumersSync are seed's sync options (its parameter hides the package).
var consumersSync = consumers.SyncOptions{}
