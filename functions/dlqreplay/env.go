package dlqreplay

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/sethvargo/go-envconfig"

	"github.com/relaybus/relaybus/shared/archive"
	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/transport"
)

// Config is the function's environment.
type Config struct {
	instance.Env
	// DatabaseURL is the producers' outbox, where re-pushes are queued (DATABASE_URL).
	DatabaseURL string `env:"DATABASE_URL"`
	// FirestoreDatabase holds the ledger and the archive (FIRESTORE_DATABASE).
	FirestoreDatabase string `env:"FIRESTORE_DATABASE, default=(default)"`
	// Auth is iam, token or none (DLQREPLAY_AUTH, iam).
	Auth string `env:"DLQREPLAY_AUTH, default=iam"`
	// Audience, when set, is checked against the ID token's audience (the
	// service URL; DLQREPLAY_AUDIENCE). Cloud Run's IAM checks it anyway.
	Audience string `env:"DLQREPLAY_AUDIENCE"`
	// Token is the bearer token for Auth=token (DLQREPLAY_TOKEN).
	Token string `env:"DLQREPLAY_TOKEN"`
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
	log := cfg.Logger()
	pool, err := instance.Postgres(ctx, cfg.DatabaseURL, outbox.Migrations)
	if err != nil {
		return nil, err
	}
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: cfg.ProjectID, Database: cfg.FirestoreDatabase}, ledger.Options{Logger: log})
	if err != nil {
		pool.Close()
		return nil, err
	}
	ps, err := transport.New(ctx, cfg.ProjectID, transport.Options{})
	if err != nil {
		pool.Close()
		return nil, err
	}
	return New(Options{Archive: archive.New(store.Client()), Ledger: store, DB: pool, Publisher: ps,
		Seeker: &Seeker{Admin: ps.PubSub().SubscriptionAdminClient, Project: cfg.ProjectID},
		Auth:   cfg.Auth, Audience: cfg.Audience, Token: cfg.Token, MaxRepushes: cfg.MaxRepushes,
		SentTimeout: cfg.SentTimeout, Logger: log})
}
