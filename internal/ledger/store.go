package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/internal/fsdoc"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/option"

	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/privacy"
	"github.com/relaybus/relaybus/internal/registry"
)

// DefaultDatabase is Firestore's default database id.
const DefaultDatabase = "(default)"

// Config names the Firestore database of the ledger (the functions
// declare its settings once, in internal/instance's Ledger).
type Config struct {
	// ProjectID is the Google Cloud project.
	ProjectID string
	// Database is the Firestore database id; default "(default)".
	Database string
}

// Options tune a Store. The zero value is ready to use.
type Options struct {
	// Audit is the operators' audit log (Store.Audit): dlqreplay opens it
	// on a database of its own (FIRESTORE_AUDIT_DATABASE). Default: the
	// log in the ledger's database.
	Audit *audit.Log
	// Registry answers the expected consumers RecordSent and
	// RecordPublishFailure write on new event documents. Default: the
	// ledger's topic_consumers registry (consumers.New on the store's
	// client) behind registry.Cached with registry.DefaultCacheTTL.
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
	Levels map[string]model.Level
	// Privacy are the topics' privacy rules (topology.PrivacyRules): what
	// event documents keep of each topic's payloads (privacy.Ledger) and
	// the subject key erasure finds them by. A topic it does not name keeps
	// payloads whole.
	Privacy privacy.Rules
	// PrivacyKey hashes personal fields and subject ids; required when a
	// rule redacts by hash or names a subject (a payload that cannot be
	// redacted for want of it is not kept).
	PrivacyKey privacy.Key
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
// It is the ledger's write path: the relay's ledger (RecordSent,
// RecordPublishFailure), the rollup (Fold, RollupMany, Reconcile,
// ExpireDue) and the operator re-push hook (BeginRepush). Recorder adds
// the consume side. The console's queries are internal/ledger/query's, the
// topic_consumers registry is internal/ledger/consumers'.
type Store struct {
	client     *firestore.Client
	ownsClient bool
	audit      *audit.Log
	events     *firestore.CollectionRef
	reg        registry.Registry
	maxPayload int
	now        func() time.Time
	log        *slog.Logger
	flights    coalescer
	retention  time.Duration
	reconcile  time.Duration
	levels     map[string]model.Level
	shards     int
	privacy    privacy.Rules
	privKey    privacy.Key
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
	if opts.Shards < 0 || opts.Shards > model.MaxShards {
		return nil, fmt.Errorf("ledger: shards %d: want 1 to %d (0: %d)", opts.Shards, model.MaxShards, model.DefaultShards)
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
		events:     c.Collection(model.CollectionEvents),
		maxPayload: opts.MaxStoredPayload,
		now:        opts.Now,
		log:        opts.Logger,
		reg:        opts.Registry,
		retention:  opts.Retention,
		reconcile:  opts.ReconcileAfter,
		levels:     opts.Levels,
		shards:     opts.Shards,
		privacy:    opts.Privacy,
		privKey:    opts.PrivacyKey,
	}
	if s.shards <= 0 {
		s.shards = model.DefaultShards
	}
	s.shards = min(s.shards, model.MaxShards)
	if s.retention == 0 {
		s.retention = DefaultRetention
	}
	if s.reconcile <= 0 {
		s.reconcile = DefaultReconcileAfter
	}
	if s.maxPayload <= 0 || s.maxPayload > model.DefaultMaxStoredPayload {
		s.maxPayload = model.DefaultMaxStoredPayload
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.audit = opts.Audit
	if s.audit == nil {
		s.audit = audit.New(c, s.clock)
	}
	if s.log == nil {
		s.log = logging.Discard()
	}
	if s.reg == nil {
		s.reg = registry.Cached(consumers.New(c, consumers.Options{Now: s.now}), registry.DefaultCacheTTL)
	}
	return s
}

// Audit returns the operators' audit log (Options.Audit, or the one in
// the ledger's database).
func (s *Store) Audit() *audit.Log { return s.audit }

// Client returns the Firestore client (query.New and consumers.New read
// the ledger through it).
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

// getDoc reads one document (one read, found or not).
func (s *Store) getDoc(ctx context.Context, tx *firestore.Transaction, ref *firestore.DocumentRef) (*firestore.DocumentSnapshot, error) {
	return fsdoc.Get(ctx, tx, ref)
}

// getAll reads the documents of refs by id (fsdoc.GetAll).
func (s *Store) getAll(ctx context.Context, refs []*firestore.DocumentRef) ([]*firestore.DocumentSnapshot, error) {
	return fsdoc.GetAll(ctx, s.client, refs)
}

// queryDocs runs a query to the end.
func (s *Store) queryDocs(ctx context.Context, tx *firestore.Transaction, q firestore.Query) ([]*firestore.DocumentSnapshot, error) {
	return fsdoc.Query(ctx, tx, q)
}

// attempts returns an event's event_consumptions subcollection
// (fsdoc.Attempts says why it is one).
func (s *Store) attempts(eventID string) *firestore.CollectionRef {
	return s.eventRef(eventID).Collection(model.CollectionConsumptions)
}

// readAttempts returns every attempt of an event, ordered by consumer and
// attempt number.
func (s *Store) readAttempts(ctx context.Context, tx *firestore.Transaction, eventID string) ([]model.Attempt, error) {
	return fsdoc.ReadAttempts(ctx, tx, s.client, eventID)
}

// eventAttempts returns every attempt of the event d is the document of:
// its attempt documents and its folded ones (WithFolded).
func (s *Store) eventAttempts(ctx context.Context, tx *firestore.Transaction, d *model.Event) ([]model.Attempt, error) {
	return fsdoc.EventAttempts(ctx, tx, s.client, d)
}

// eventRef returns an event's document.
func (s *Store) eventRef(eventID string) *firestore.DocumentRef {
	return s.events.Doc(model.EventDocID(eventID))
}

// notFound reports whether a Firestore error means the document is absent.
func notFound(err error) bool { return fsdoc.NotFound(err) }

// alreadyExists reports whether a Firestore error means a create found the
// document there.
func alreadyExists(err error) bool { return fsdoc.AlreadyExists(err) }

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

// Expected returns the ids of the consumers a topic's events are sent to
// now, through the store's registry (Options.Registry: cached), so the
// rollup can tell when every consumer of an event has reported.
func (s *Store) Expected(ctx context.Context, topic string) ([]string, error) {
	cs, err := s.reg.ExpectedConsumers(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("ledger: expected consumers of %s: %w", topic, err)
	}
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.ConsumerID
	}
	return out, nil
}
