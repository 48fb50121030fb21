package consume

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/sethvargo/go-envconfig"

	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/inbox"
	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/migrate"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
	"github.com/relaybus/relaybus/shared/transport"
)

// Config is the function's environment.
type Config struct {
	instance.Env
	// LedgerBudget bounds one batch of ledger writes (LEDGER_BUDGET, 10s).
	LedgerBudget time.Duration `env:"LEDGER_BUDGET, default=10s"`
	// DatabaseURL is the consumer's Postgres: inbox, attempts, projections,
	// its outbox for child events (DATABASE_URL).
	DatabaseURL string `env:"DATABASE_URL"`
	// DatabaseDirectURL, when set, is where migrations run
	// (DATABASE_DIRECT_URL): the database itself when DATABASE_URL is a
	// transaction-mode pooler.
	DatabaseDirectURL string `env:"DATABASE_DIRECT_URL"`
	// ConsumerID is the consumer service (CONSUMER_ID, required).
	ConsumerID string `env:"CONSUMER_ID, required"`
	// Subscription is its subscription id (CONSUMER_SUBSCRIPTION).
	Subscription string `env:"CONSUMER_SUBSCRIPTION"`
	// Handler is the handler's name (CONSUMER_HANDLER, projection).
	Handler string `env:"CONSUMER_HANDLER, default=projection"`
	// ForwardURL is the forward handler's target (FORWARD_URL).
	ForwardURL string `env:"FORWARD_URL"`
	// ForwardAuth is how the forward handler authenticates (FORWARD_AUTH:
	// none, google or hmac; none).
	ForwardAuth string `env:"FORWARD_AUTH, default=none"`
	// ForwardAudience is the ID tokens' audience with FORWARD_AUTH=google
	// (FORWARD_AUDIENCE; FORWARD_URL when empty).
	ForwardAudience string `env:"FORWARD_AUDIENCE"`
	// ForwardSigningSecret is the signing secret with FORWARD_AUTH=hmac
	// (FORWARD_SIGNING_SECRET: "whsec_" + base64; several, space-separated,
	// all sign), in production from Secret Manager.
	ForwardSigningSecret string `env:"FORWARD_SIGNING_SECRET"`
	// ForwardTimeout bounds one forward (FORWARD_TIMEOUT, 10s).
	ForwardTimeout time.Duration `env:"FORWARD_TIMEOUT, default=10s"`
	// GapTimeout is how long a strict consumer's version gap may stay open
	// before it is reported (STRICT_GAP_TIMEOUT, 10m).
	GapTimeout time.Duration `env:"STRICT_GAP_TIMEOUT, default=10m"`
	// MaxDeliveryAttempts is the subscription's dead-letter threshold
	// (CONSUMER_MAX_DELIVERY_ATTEMPTS, 5).
	MaxDeliveryAttempts int `env:"CONSUMER_MAX_DELIVERY_ATTEMPTS, default=5"`
	// InboxRetention is how long inbox rows are kept (INBOX_RETENTION, 192h).
	InboxRetention time.Duration `env:"INBOX_RETENTION, default=192h"`
	// RollupTopic receives attempt notices (ROLLUP_TOPIC).
	RollupTopic string `env:"ROLLUP_TOPIC, default=relaybus.ledger.rollup"`
	// Ledger is firestore or off (LEDGER, firestore).
	Ledger string `env:"LEDGER, default=firestore"`
	// FirestoreDatabase is the ledger's database id (FIRESTORE_DATABASE).
	FirestoreDatabase string `env:"FIRESTORE_DATABASE, default=(default)"`
	// LedgerRetention is how long ledger documents are kept (LEDGER_RETENTION, 720h).
	LedgerRetention time.Duration `env:"LEDGER_RETENTION, default=720h"`
}

func init() {
	functions.HTTP("consume", instance.Lazy("consume", fromEnv))
}

func fromEnv(ctx context.Context) (http.Handler, error) {
	var cfg Config
	if err := envconfig.Process(ctx, &cfg); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	log := cfg.Logger()
	h, err := BuildHandler(cfg.Handler, HandlerConfig{ConsumerID: cfg.ConsumerID, ForwardURL: cfg.ForwardURL,
		ForwardAuth: cfg.ForwardAuth, ForwardAudience: cfg.ForwardAudience, ForwardSecrets: strings.Fields(cfg.ForwardSigningSecret),
		ForwardTimeout: cfg.ForwardTimeout, GapTimeout: cfg.GapTimeout, Logger: log})
	if err != nil {
		return nil, err
	}
	top, err := topology.Load(cfg.Topology)
	if err != nil {
		return nil, err
	}
	pool, err := postgres.Open(ctx, postgres.Config{URL: cfg.DatabaseURL, DirectURL: cfg.DatabaseDirectURL}, Migrations...)
	if err != nil {
		return nil, err
	}
	closers := []func(context.Context) error{func(context.Context) error { pool.Close(); return nil }}
	fail := func(err error) (http.Handler, error) {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i](context.Background())
		}
		return nil, err
	}
	if m, ok := h.(Migrator); ok {
		if err := m.Migrate(ctx, pool); err != nil {
			return fail(err)
		}
	}
	ps, err := transport.New(ctx, cfg.ProjectID, transport.Options{})
	if err != nil {
		return fail(err)
	}
	closers = append(closers, func(context.Context) error { return ps.Close() })
	store, err := ledger.OpenMode(ctx, cfg.Ledger, ledger.Config{ProjectID: cfg.ProjectID, Database: cfg.FirestoreDatabase},
		ledger.Options{Logger: log, Retention: cfg.LedgerRetention})
	if err != nil {
		return fail(err)
	}
	var led relay.Ledger
	o := consumer.Options{DB: pool, ConsumerID: cfg.ConsumerID, Subscription: cfg.Subscription, Handler: h,
		DeadLetters: ps, MaxDeliveryAttempts: cfg.MaxDeliveryAttempts, LedgerBudget: cfg.LedgerBudget, Logger: log}
	if store != nil {
		closers = append(closers, func(context.Context) error { return store.Close() })
		o.Ledger = ledger.NewRecorder(store, ps, cfg.RollupTopic)
		led = store
	}
	// The kick of the handlers' child events: a relay of this database with
	// the relay's defaults (the scheduled drain of this database is the
	// relay function's).
	kicker, err := relay.New(relay.Options{DB: pool, Publisher: ps, Topology: top, Ledger: led, LedgerBudget: cfg.LedgerBudget, Logger: log})
	if err != nil {
		return fail(err)
	}
	closers = append(closers, kicker.Close)
	o.Kicker = kicker
	engine, err := consumer.New(o)
	if err != nil {
		return fail(err)
	}
	fn, err := New(Options{Engine: engine, DB: pool, InboxRetention: cfg.InboxRetention, Logger: log})
	if err != nil {
		return fail(err)
	}
	// At shutdown: the engine's attempts first (New put it first), then the
	// kicks, the ledger and the clients.
	for i := len(closers) - 1; i >= 0; i-- {
		fn.close = append(fn.close, closers[i])
	}
	return fn, nil
}

// Migrator is a handler with tables of its own; consume migrates them at
// start.
type Migrator interface {
	Migrate(ctx context.Context, db migrate.Beginner) error
}

// Migrate applies every table a consumer uses: the inbox, the projections
// and the outbox its handlers emit child events into.
func Migrate(ctx context.Context, db consumer.DB) error {
	for _, l := range Migrations {
		if _, err := l.Apply(ctx, db); err != nil {
			return err
		}
	}
	return nil
}

// Migrations are the lines Migrate applies.
var Migrations = []migrate.Line{inbox.Migrations, projection.Migrations, outbox.Migrations}
