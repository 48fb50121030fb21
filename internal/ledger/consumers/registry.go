// Package consumers is the ledger's consumer registry: the topic_consumers
// collection, which says which consumers each topic's events are expected
// by. [Registry.SyncConsumers] makes it match the topology at deploy,
// [Registry.ExpectedConsumers] answers registry.Registry over it (the
// relay's RecordSent writes its answer on each new event), and
// [Registry.Consumers] and [Registry.ChangeConsumer] are the console's
// view and edits, each edit written with its audit entry.
package consumers

import (
	"time"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ledger/model"
)

// Options tune a Registry. The zero value is ready to use.
type Options struct {
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Audit is where ChangeConsumer records who changed what (default:
	// the audit log in the registry's own database, written in the
	// change's transaction; ledger.Store.Audit is the one to pass).
	Audit *audit.Log
}

// Registry is the topic_consumers collection of the ledger's Firestore
// database. It is safe for concurrent use.
type Registry struct {
	client    *firestore.Client
	consumers *firestore.CollectionRef
	audit     *audit.Log
	now       func() time.Time
}

// New returns the registry on the ledger's client (ledger.Store.Client);
// it never closes the client.
func New(c *firestore.Client, opts Options) *Registry {
	r := &Registry{client: c, consumers: c.Collection(model.CollectionConsumers), now: opts.Now}
	if r.now == nil {
		r.now = time.Now
	}
	r.audit = opts.Audit
	if r.audit == nil {
		r.audit = audit.New(c, r.clock)
	}
	return r
}

func (s *Registry) clock() time.Time { return s.now().UTC() }
