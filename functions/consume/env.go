package consume

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/sethvargo/go-envconfig"

	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/inbox"
	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/migrate"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/transport"
)

// Config is the function's environment.
type Config struct {
	instance.Env
	// DatabaseURL is the consumer's Postgres: inbox, projections, its
	// outbox for child events (DATABASE_URL).
	DatabaseURL string `env:"DATABASE_URL"`
	// ConsumerID is the consumer service (CONSUMER_ID, required).
	ConsumerID string `env:"CONSUMER_ID, required"`
	// Subscription is its subscription id (CONSUMER_SUBSCRIPTION).
	Subscription string `env:"CONSUMER_SUBSCRIPTION"`
	// Handler is the handler's name (CONSUMER_HANDLER, projection).
	Handler string `env:"CONSUMER_HANDLER, default=projection"`
	// ForwardURL is the forward handler's target (FORWARD_URL).
	ForwardURL string `env:"FORWARD_URL"`
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
	h, err := BuildHandler(cfg.Handler, HandlerConfig{ConsumerID: cfg.ConsumerID, ForwardURL: cfg.ForwardURL})
	if err != nil {
		return nil, err
	}
	pool, err := instance.Postgres(ctx, cfg.DatabaseURL, Migrations...)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (http.Handler, error) {
		pool.Close()
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
	o := consumer.Options{DB: pool, ConsumerID: cfg.ConsumerID, Subscription: cfg.Subscription, Handler: h,
		DeadLetters: ps, MaxDeliveryAttempts: cfg.MaxDeliveryAttempts, Logger: log}
	store, err := ledger.OpenMode(ctx, cfg.Ledger, ledger.Config{ProjectID: cfg.ProjectID, Database: cfg.FirestoreDatabase}, ledger.Options{Logger: log})
	if err != nil {
		return fail(err)
	}
	if store != nil {
		o.Ledger = ledger.NewRecorder(store, ps, cfg.RollupTopic)
	}
	engine, err := consumer.New(o)
	if err != nil {
		return fail(err)
	}
	return New(Options{Engine: engine, DB: pool, InboxRetention: cfg.InboxRetention, Logger: log})
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
