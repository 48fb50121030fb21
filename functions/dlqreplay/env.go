package dlqreplay

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sethvargo/go-envconfig"

	"github.com/relaybus/relaybus/shared/archive"
	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/topology"
	"github.com/relaybus/relaybus/shared/transport"
)

// Config is the function's environment.
type Config struct {
	instance.Env
	// DatabaseURL is the producers' outbox, where re-pushes are queued (DATABASE_URL).
	DatabaseURL string `env:"DATABASE_URL"`
	// DatabaseDirectURL, when set, is where migrations run
	// (DATABASE_DIRECT_URL): the database itself when DATABASE_URL is a
	// transaction-mode pooler.
	DatabaseDirectURL string `env:"DATABASE_DIRECT_URL"`
	// FirestoreDatabase holds the ledger and the archive (FIRESTORE_DATABASE).
	FirestoreDatabase string `env:"FIRESTORE_DATABASE, default=(default)"`
	// Auth is cloudrun, iam, token or none (DLQREPLAY_AUTH, iam). Behind
	// Cloud Run IAM use cloudrun.
	Auth string `env:"DLQREPLAY_AUTH, default=iam"`
	// Audience, when set, is checked against the ID token's audience (the
	// service URL; DLQREPLAY_AUDIENCE). Cloud Run's IAM checks it anyway.
	Audience string `env:"DLQREPLAY_AUDIENCE"`
	// Token is the static token of Auth=token, from Secret Manager
	// (DLQREPLAY_TOKEN), sent in the X-Relaybus-Token header.
	Token string `env:"DLQREPLAY_TOKEN"`
	// Writers may write (DLQREPLAY_WRITERS, comma-separated; empty or *:
	// every authenticated caller); ReadOnly lets nobody write
	// (DLQREPLAY_READ_ONLY).
	Writers  []string `env:"DLQREPLAY_WRITERS"`
	ReadOnly bool     `env:"DLQREPLAY_READ_ONLY, default=false"`
	// Archivers may POST /deadletters:archive (DLQREPLAY_ARCHIVERS; empty:
	// every authenticated caller): the DLQ monitors' push service account.
	Archivers []string `env:"DLQREPLAY_ARCHIVERS"`
	// Subscriptions maps logical subscription ids to real ones
	// (DLQREPLAY_SUBSCRIPTIONS, a JSON object; see topology.SubscriptionMap).
	Subscriptions string `env:"DLQREPLAY_SUBSCRIPTIONS"`
	// Retention is how long dead letters are kept (ARCHIVE_RETENTION, 720h):
	// each gets deleteAt = archived + retention for Firestore's TTL policy.
	Retention time.Duration `env:"ARCHIVE_RETENTION, default=720h"`
	// LedgerRetention is how long ledger documents are kept
	// (LEDGER_RETENTION, 720h), for the ledger writes of re-pushes.
	LedgerRetention time.Duration `env:"LEDGER_RETENTION, default=720h"`
	// MaxRepushes and SentTimeout are the re-push rules
	// (DLQREPLAY_MAX_REPUSHES 3, DLQREPLAY_SENT_TIMEOUT 10m).
	MaxRepushes int           `env:"DLQREPLAY_MAX_REPUSHES, default=3"`
	SentTimeout time.Duration `env:"DLQREPLAY_SENT_TIMEOUT, default=10m"`
}

func init() {
	functions.HTTP("dlqreplay", instance.Lazy("dlqreplay", fromEnv))
}

func fromEnv(ctx context.Context) (http.Handler, error) {
	var cfg Config
	if err := envconfig.Process(ctx, &cfg); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if cfg.Retention <= 0 {
		return nil, fmt.Errorf("ARCHIVE_RETENTION=%s: want a positive duration such as 720h", cfg.Retention)
	}
	log := cfg.Logger()
	top, err := topology.Load("")
	if err != nil {
		return nil, err
	}
	subs, err := topology.ParseSubscriptionMap(top, cfg.Subscriptions)
	if err != nil {
		return nil, err
	}
	pool, err := postgres.Open(ctx, postgres.Config{URL: cfg.DatabaseURL, DirectURL: cfg.DatabaseDirectURL}, outbox.Migrations)
	if err != nil {
		return nil, err
	}
	// The other databases of the topology, when their URLs are given
	// (DATABASE_URL_<NAME>): their inboxes and outboxes answer dry runs and
	// outbox states. Their migrations are their consumers' business.
	dbs := map[string]outbox.DBTX{topology.MainDatabase: pool}
	for _, d := range top.Databases {
		if url := os.Getenv(d.EnvVar()); d.Name != topology.MainDatabase && url != "" {
			p, err := postgres.Open(ctx, postgres.Config{URL: url})
			if err != nil {
				pool.Close()
				return nil, fmt.Errorf("%s: %w", d.EnvVar(), err)
			}
			dbs[d.Name] = p
		}
	}
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: cfg.ProjectID, Database: cfg.FirestoreDatabase}, ledger.Options{Logger: log, Retention: cfg.LedgerRetention})
	if err != nil {
		pool.Close()
		return nil, err
	}
	ps, err := transport.New(ctx, cfg.ProjectID, transport.Options{})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return New(Options{
		Archive: archive.New(store.Client(), archive.WithRetention(cfg.Retention), archive.WithSubscriptions(subs)),
		Ledger:  store, DB: pool, Publisher: ps, Topology: top, Subscriptions: subs, Databases: dbs,
		Seeker: &Seeker{Admin: ps.PubSub().SubscriptionAdminClient, Project: cfg.ProjectID},
		Auth:   cfg.Auth, Audience: cfg.Audience, Token: cfg.Token, Writers: cfg.Writers, ReadOnly: cfg.ReadOnly, Archivers: cfg.Archivers,
		MaxRepushes: cfg.MaxRepushes, SentTimeout: cfg.SentTimeout, Logger: log,
	})
}

// Databases turns the pools of the topology's databases (by name) into
// Options.Databases.
func Databases(pools map[string]*pgxpool.Pool) map[string]outbox.DBTX {
	out := make(map[string]outbox.DBTX, len(pools))
	for name, p := range pools {
		out[name] = p
	}
	return out
}
