package consumers

import (
	"context"
	"os"
	"testing"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/fscount"
	"github.com/relaybus/relaybus/internal/ledger/audit"
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

// testStore is a registry with the audit log its edits write to.
type testStore struct{ *Registry }

// Audit returns the registry's audit log.
func (s testStore) Audit() *audit.Log { return s.audit }

// newStore returns a registry on a Firestore emulator project of its own.
func newStore(t testing.TB, opts Options) testStore {
	t.Helper()
	s, _ := newCountedStore(t, opts)
	return s
}

// newCountedStore returns a registry on a project of its own and the
// counter of the reads and writes its client's RPCs carry.
func newCountedStore(t testing.TB, opts Options) (testStore, *fscount.Counter) {
	t.Helper()
	counter := new(fscount.Counter)
	c, err := firestore.NewClientWithDatabase(context.Background(), emutest.FirestoreProject(t), "(default)", counter.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return testStore{New(c, opts)}, counter
}

// seed registers consumers for a topic in topic_consumers.
func seed(t testing.TB, s testStore, topic string, consumers ...string) {
	t.Helper()
	var cs []registry.Consumer
	for i, c := range consumers {
		cs = append(cs, registry.Consumer{Topic: topic, ConsumerID: c, Enabled: true, SortOrder: i + 1})
	}
	if _, err := s.SyncConsumers(context.Background(), cs, SyncOptions{}); err != nil {
		t.Fatal(err)
	}
}
