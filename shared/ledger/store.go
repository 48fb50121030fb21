package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/shared/logging"
	"github.com/relaybus/relaybus/shared/registry"
)

// DefaultDatabase is Firestore's default database id.
const DefaultDatabase = "(default)"

// Config names the Firestore database of the ledger (the functions
// declare its settings once, in shared/instance's Ledger).
type Config struct {
	// ProjectID is the Google Cloud project.
	ProjectID string
	// Database is the Firestore database id; default "(default)".
	Database string
}

// Options tune a Store. The zero value is ready to use.
type Options struct {
	// Registry answers the expected consumers RecordSent and
	// RecordPublishFailure write on new event documents. Default: the
	// store's own topic_consumers registry behind registry.Cached with
	// registry.DefaultCacheTTL.
	Registry registry.Registry
	// MaxStoredPayload is the largest payload kept in an event document
	// (DefaultMaxStoredPayload when zero; capped there).
	MaxStoredPayload int
	// Now is the clock (time.Now when nil); tests move it to expire events.
	Now func() time.Time
	// Logger receives warnings about writes the ledger heals (logging.Discard
	// when nil).
	Logger *slog.Logger
	// Retention is how long the ledger keeps documents: every event and
	// attempt document gets deleteAt = its creation + Retention, the field
	// Firestore's TTL policies delete by (DefaultRetention when zero;
	// negative writes no deleteAt).
	Retention time.Duration
	// Shards is how many index shards new event documents are spread over
	// (DefaultShards when zero; at most MaxShards, Open refuses more):
	// size it for the target rate, rate / 500 or more (see DefaultShards).
	Shards int
	// Levels is each topic's ledger level (Level); a topic it does not
	// name has DefaultLevel. LevelsOf reads them from the topology.
	Levels map[string]Level
	// ReconcileAfter is how long after its last status change an event
	// that is not settled waits before the reconciler derives its status
	// again (DefaultReconcileAfter when zero).
	ReconcileAfter time.Duration
}

// Defaults of Options.
const (
	DefaultRetention      = 30 * 24 * time.Hour
	DefaultReconcileAfter = time.Minute
)

// Store is the event ledger on Firestore. It is safe for concurrent use.
//
// It implements the relay's ledger (RecordSent, RecordPublishFailure), the
// registry (ExpectedConsumers over topic_consumers), the rollup (Fold,
// RollupMany, Reconcile, ExpireDue), the operator re-push hook (BeginRepush) and the operations
// API's queries (List, Get, Trace). Recorder adds the consume side.
type Store struct {
	client     *firestore.Client
	ownsClient bool
	events     *firestore.CollectionRef
	consumers  *firestore.CollectionRef
	reg        registry.Registry
	maxPayload int
	now        func() time.Time
	log        *slog.Logger
	usage      usage
	flights    coalescer
	retention  time.Duration
	reconcile  time.Duration
	levels     map[string]Level
	shards     int
}

// Open connects to Firestore (the emulator when FIRESTORE_EMULATOR_HOST is
// set) and returns a store that closes the client on Close.
func Open(ctx context.Context, cfg Config, opts Options, clientOpts ...option.ClientOption) (*Store, error) {
	if cfg.ProjectID == "" {
		return nil, errors.New("ledger: no project id (GOOGLE_CLOUD_PROJECT)")
	}
	if cfg.Database == "" {
		cfg.Database = DefaultDatabase
	}
	if opts.Shards < 0 || opts.Shards > MaxShards {
		return nil, fmt.Errorf("ledger: shards %d: want 1 to %d (0: %d)", opts.Shards, MaxShards, DefaultShards)
	}
	c, err := firestore.NewClientWithDatabase(ctx, cfg.ProjectID, cfg.Database, clientOpts...)
	if err != nil {
		return nil, fmt.Errorf("ledger: firestore client for %s/%s: %w", cfg.ProjectID, cfg.Database, err)
	}
	s := New(c, opts)
	s.ownsClient = true
	return s, nil
}

// New returns a store on an existing client; Close leaves the client open.
func New(c *firestore.Client, opts Options) *Store {
	s := &Store{
		client:     c,
		events:     c.Collection(CollectionEvents),
		consumers:  c.Collection(CollectionConsumers),
		maxPayload: opts.MaxStoredPayload,
		now:        opts.Now,
		log:        opts.Logger,
		reg:        opts.Registry,
		retention:  opts.Retention,
		reconcile:  opts.ReconcileAfter,
		levels:     opts.Levels,
		shards:     opts.Shards,
	}
	if s.shards <= 0 {
		s.shards = DefaultShards
	}
	s.shards = min(s.shards, MaxShards)
	if s.retention == 0 {
		s.retention = DefaultRetention
	}
	if s.reconcile <= 0 {
		s.reconcile = DefaultReconcileAfter
	}
	if s.maxPayload <= 0 || s.maxPayload > DefaultMaxStoredPayload {
		s.maxPayload = DefaultMaxStoredPayload
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = logging.Discard()
	}
	if s.reg == nil {
		s.reg = registry.Cached(s, registry.DefaultCacheTTL)
	}
	s.usage.ops = map[string]*opCounts{}
	return s
}

// Client returns the Firestore client.
func (s *Store) Client() *firestore.Client { return s.client }

// Close closes the client if Open created it.
func (s *Store) Close() error {
	if s.ownsClient {
		return s.client.Close()
	}
	return nil
}

func (s *Store) clock() time.Time { return s.now().UTC() }

// deleteAt is the TTL field's value for a document created at t (zero:
// none, when the store keeps documents).
func (s *Store) deleteAt(t time.Time) time.Time {
	if s.retention < 0 {
		return time.Time{}
	}
	return t.Add(s.retention)
}

// Usage counts the Firestore document reads and writes the store has made
// (what Firestore bills): a document read by a get or a query is one read,
// a query that returns nothing is one read, every document written
// (created, updated, including creates refused because the document exists)
// is one write. Reads and writes of transactions that were retried count
// every time.
type Usage struct {
	Reads  int64
	Writes int64
	// ByOp splits the totals by store operation (record_sent, rollup, ...).
	ByOp map[string]Counts
}

// Counts are the reads and writes of one operation.
type Counts struct {
	Reads  int64
	Writes int64
}

type opCounts struct{ reads, writes atomic.Int64 }

type usage struct {
	mu  sync.Mutex
	ops map[string]*opCounts
}

func (u *usage) op(name string) *opCounts {
	u.mu.Lock()
	defer u.mu.Unlock()
	c := u.ops[name]
	if c == nil {
		c = &opCounts{}
		u.ops[name] = c
	}
	return c
}

// Usage returns the reads and writes counted so far.
func (s *Store) Usage() Usage {
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	u := Usage{ByOp: make(map[string]Counts, len(s.usage.ops))}
	for name, c := range s.usage.ops {
		r, w := c.reads.Load(), c.writes.Load()
		u.Reads += r
		u.Writes += w
		u.ByOp[name] = Counts{Reads: r, Writes: w}
	}
	return u
}

// Operation names in Usage.ByOp.
const (
	OpRecordSent     = "record_sent"
	OpPublishFailure = "record_publish_failure"
	OpRecordAttempt  = "record_attempt"
	OpRollup         = "rollup"
	OpRegistry       = "registry"
	OpSyncConsumers  = "sync_consumers"
	OpRepush         = "repush"
	OpExpire         = "expire"
	OpReconcile      = "reconcile"
	OpQuery          = "query"
)

// getDoc reads one document (one read, found or not).
func (s *Store) getDoc(ctx context.Context, op string, tx *firestore.Transaction, ref *firestore.DocumentRef) (*firestore.DocumentSnapshot, error) {
	s.usage.op(op).reads.Add(1)
	if tx != nil {
		return tx.Get(ref)
	}
	return ref.Get(ctx)
}

// getAll reads the documents of refs by id, at most maxGetAll to a
// request, counts the reads and returns the snapshots in refs' order (a
// document that does not exist has a snapshot whose Exists is false).
func (s *Store) getAll(ctx context.Context, op string, refs []*firestore.DocumentRef) ([]*firestore.DocumentSnapshot, error) {
	out := make([]*firestore.DocumentSnapshot, 0, len(refs))
	for len(refs) > 0 {
		n := min(len(refs), maxGetAll)
		s.usage.op(op).reads.Add(int64(n))
		snaps, err := s.client.GetAll(ctx, refs[:n])
		if err != nil {
			return nil, err
		}
		out = append(out, snaps...)
		refs = refs[n:]
	}
	return out, nil
}

// maxGetAll is the most documents one GetAll asks for.
const maxGetAll = 500

// queryDocs runs a query to the end and counts its reads.
func (s *Store) queryDocs(ctx context.Context, op string, tx *firestore.Transaction, q firestore.Query) ([]*firestore.DocumentSnapshot, error) {
	var it *firestore.DocumentIterator
	if tx != nil {
		it = tx.Documents(q)
	} else {
		it = q.Documents(ctx)
	}
	defer it.Stop()
	var out []*firestore.DocumentSnapshot
	for {
		d, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			s.usage.op(op).reads.Add(max(int64(len(out)), 1))
			return nil, err
		}
		out = append(out, d)
	}
	s.usage.op(op).reads.Add(max(int64(len(out)), 1))
	return out, nil
}

func (s *Store) wrote(op string, n int) { s.usage.op(op).writes.Add(int64(n)) }

// attempts returns an event's event_consumptions subcollection.
//
// Attempts live under their event (events/{id}/event_consumptions/{id})
// rather than in one top-level collection so that reading an event's
// attempts in a transaction locks that event's attempts alone: the
// Firestore emulator locks a whole collection for a query in a
// transaction, so with one top-level collection every rollup would hold up
// every attempt insert of every event in local runs. In production both
// layouts lock only the range read. The attempt's document need not wait
// for its event's: Firestore allows documents under a missing parent.
func (s *Store) attempts(eventID string) *firestore.CollectionRef {
	return s.eventRef(eventID).Collection(CollectionConsumptions)
}

// attemptsQuery selects every attempt of an event.
func (s *Store) attemptsQuery(eventID string) firestore.Query {
	return shapeAttemptsOfEvent.query(s.attempts(eventID).Query, nil)
}

// readAttempts returns every attempt of an event, ordered by consumer and
// attempt number.
func (s *Store) readAttempts(ctx context.Context, op string, tx *firestore.Transaction, eventID string) ([]Attempt, error) {
	docs, err := s.queryDocs(ctx, op, tx, s.attemptsQuery(eventID))
	if err != nil {
		return nil, fmt.Errorf("read attempts of %s: %w", eventID, err)
	}
	out := make([]Attempt, 0, len(docs))
	for _, d := range docs {
		var a Attempt
		if err := d.DataTo(&a); err != nil {
			return nil, fmt.Errorf("decode attempt %s: %w", d.Ref.ID, err)
		}
		out = append(out, a)
	}
	sortAttempts(out)
	return out, nil
}

// eventAttempts returns every attempt of the event d is the document of:
// its attempt documents and its folded ones (withFolded).
func (s *Store) eventAttempts(ctx context.Context, op string, tx *firestore.Transaction, d *Event) ([]Attempt, error) {
	docs, err := s.readAttempts(ctx, op, tx, d.EventID)
	if err != nil {
		return nil, err
	}
	return withFolded(d, docs), nil
}

// eventRef returns an event's document.
func (s *Store) eventRef(eventID string) *firestore.DocumentRef {
	return s.events.Doc(EventDocID(eventID))
}

// ErrEventNotFound means the ledger holds no document for the event (yet).
var ErrEventNotFound = errors.New("event not in the ledger")

// notFound reports whether a Firestore error means the document is absent.
func notFound(err error) bool { return status.Code(err) == codes.NotFound }

// alreadyExists reports whether a Firestore error means a create found the
// document there.
func alreadyExists(err error) bool { return status.Code(err) == codes.AlreadyExists }

// Ledger modes, the values of the functions' LEDGER variable.
const (
	// ModeFirestore records events and attempts in Firestore (the default).
	ModeFirestore = "firestore"
	// ModeOff records nothing (a consumer or producer without a ledger).
	ModeOff = "off"
)

// OpenMode opens the store for a LEDGER mode: the store for "firestore"
// (or ""), nil and no error for "off", an error naming the variable for
// anything else.
func OpenMode(ctx context.Context, mode string, cfg Config, opts Options) (*Store, error) {
	switch mode {
	case ModeOff:
		return nil, nil
	case ModeFirestore, "":
		return Open(ctx, cfg, opts)
	}
	return nil, fmt.Errorf("LEDGER=%q: want %s or %s", mode, ModeFirestore, ModeOff)
}
