package dlqreplay

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/shared/archive"
	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/ledger/audit"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/topology"
)

// Config is the dlqreplay function's configuration.
type Config struct {
	instance.Env
	PubSub instance.PubSub
	// Ledger holds the ledger and the archive (FIRESTORE_DATABASE,
	// LEDGER_RETENTION for the ledger writes of re-pushes).
	Ledger instance.Ledger
	// AuditDatabase is the Firestore database of the operators' audit
	// log (FIRESTORE_AUDIT_DATABASE; empty: the ledger's). In production
	// a database of its own, where this function's identity may create
	// and read entries and nobody may change or delete one (Terraform).
	AuditDatabase string `env:"FIRESTORE_AUDIT_DATABASE"`
	// DB is the producers' outbox, where re-pushes are queued, in the
	// topology's main database (DATABASE_URL).
	DB instance.Database
	// DatabaseURLs are the topology's other databases, by name, when their
	// URLs are given (DATABASE_URL_<NAME>; LoadConfig fills it): their
	// inboxes and outboxes answer dry runs and outbox states. Their
	// migrations are their consumers' business.
	DatabaseURLs map[string]string
	// Auth is cloudrun, iam, token or none (DLQREPLAY_AUTH, default iam).
	// Behind Cloud Run IAM use cloudrun.
	Auth string `env:"DLQREPLAY_AUTH, default=iam"`
	// Audience, when set, is checked against the ID token's audience (the
	// service URL; DLQREPLAY_AUDIENCE). Cloud Run's IAM checks it anyway.
	Audience string `env:"DLQREPLAY_AUDIENCE"`
	// Token is the static token of Auth=token, from Secret Manager
	// (DLQREPLAY_TOKEN), sent in the X-Relaybus-Token header.
	Token string `env:"DLQREPLAY_TOKEN"`
	// Writers may write (DLQREPLAY_WRITERS, comma-separated; empty or *:
	// every authenticated caller); ReadOnly lets nobody write
	// (DLQREPLAY_READ_ONLY, default false).
	Writers  []string `env:"DLQREPLAY_WRITERS"`
	ReadOnly bool     `env:"DLQREPLAY_READ_ONLY, default=false"`
	// Archivers may POST /deadletters:archive (DLQREPLAY_ARCHIVERS; empty:
	// every authenticated caller): the DLQ monitors' push service account.
	Archivers []string `env:"DLQREPLAY_ARCHIVERS"`
	// Subscriptions maps logical subscription ids to real ones
	// (DLQREPLAY_SUBSCRIPTIONS, a JSON object; see topology.SubscriptionMap).
	Subscriptions string `env:"DLQREPLAY_SUBSCRIPTIONS"`
	// Pauser, when set, pauses and resumes consumers instead of detaching
	// their push endpoints on Pub/Sub (the local stack's delivery loop; no
	// variable).
	Pauser Pauser
	// TraceProject is the project whose Cloud Trace the console links
	// events' traces to (DLQREPLAY_TRACE_PROJECT; empty: the function's
	// project in production, none against the emulators, whose traces go
	// nowhere Google shows).
	TraceProject string `env:"DLQREPLAY_TRACE_PROJECT"`
	// PushTargets are the push consumers' endpoints and OIDC identities
	// (DLQREPLAY_PUSH_TARGETS, a JSON object; see ParsePushTargets): what
	// resume restores.
	PushTargets string `env:"DLQREPLAY_PUSH_TARGETS"`
	// PullConsumers are the consumers deployed in pull mode, by logical
	// subscription, comma-separated (DLQREPLAY_PULL_CONSUMERS; Terraform
	// sets it from pull_mode): pause, resume and rebuild refuse them with
	// the reason instead of failing on a subscription without push.
	PullConsumers []string `env:"DLQREPLAY_PULL_CONSUMERS"`
	// Retention is how long dead letters are kept (ARCHIVE_RETENTION,
	// default 720h): each gets deleteAt = archived + retention for
	// Firestore's TTL policy.
	Retention time.Duration `env:"ARCHIVE_RETENTION, default=720h"`
	// MaxRepushes and SentTimeout are the re-push rules
	// (DLQREPLAY_MAX_REPUSHES, default 3; DLQREPLAY_SENT_TIMEOUT, default
	// 10m).
	MaxRepushes int           `env:"DLQREPLAY_MAX_REPUSHES, default=3"`
	SentTimeout time.Duration `env:"DLQREPLAY_SENT_TIMEOUT, default=10m"`
}

// LoadConfig reads the configuration from the environment, with the URLs
// of the topology's databases that are set.
func LoadConfig(ctx context.Context) (Config, error) {
	c, err := instance.Load[Config](ctx)
	if err != nil {
		return c, err
	}
	top, err := topology.Load(c.Topology)
	if err != nil {
		return c, err
	}
	var dbs []string
	for _, d := range top.Databases {
		dbs = append(dbs, d.Name)
	}
	c.DatabaseURLs = instance.DatabaseURLs(dbs)
	return c, nil
}

func init() {
	functions.HTTP("dlqreplay", instance.Lazy("dlqreplay", instance.FromEnv(LoadConfig, Build)))
}

// Build is the dlqreplay function's one constructor, in production (from
// LoadConfig), in the local stack and in tests: the topology, the outbox
// pool (migrated), the pools of the other databases given, the ledger and
// its archive, one Pub/Sub client and the seeker. Close closes them.
func Build(ctx context.Context, cfg Config) (*Function, error) {
	if cfg.Retention <= 0 {
		return nil, fmt.Errorf("ARCHIVE_RETENTION=%s: want a positive duration such as 720h", cfg.Retention)
	}
	log := cfg.Logger()
	top, err := topology.Load(cfg.Topology)
	if err != nil {
		return nil, err
	}
	subs, err := topology.ParseSubscriptionMap(top, cfg.Subscriptions)
	if err != nil {
		return nil, err
	}
	targets, err := ParsePushTargets(cfg.PushTargets)
	if err != nil {
		return nil, err
	}
	f := &Function{}
	fail := func(err error) (*Function, error) {
		_ = f.close.Close(context.Background())
		return nil, err
	}
	// Before the pools, which trace their statements; replays and
	// re-pushes start sampled spans (forcedSpan).
	flush, err := cfg.StartTelemetry(ctx, "dlqreplay")
	if err != nil {
		return nil, err
	}
	f.close.Add(flush) // first, so it is flushed last
	pool, err := cfg.DB.Open(ctx, outbox.Migrations)
	if err != nil {
		return fail(err)
	}
	f.close.Add(func(context.Context) error { pool.Close(); return nil })
	dbs := map[string]postgres.DBTX{topology.MainDatabase: pool}
	for _, d := range top.Databases {
		url := cfg.DatabaseURLs[d.Name]
		if d.Name == topology.MainDatabase || url == "" {
			continue
		}
		p, err := instance.Database{URL: url}.Open(ctx)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", d.EnvVar(), err))
		}
		f.close.Add(func(context.Context) error { p.Close(); return nil })
		dbs[d.Name] = p
	}
	lo := ledger.Options{Logger: log}
	if cfg.AuditDatabase != "" && cfg.AuditDatabase != cfg.Ledger.Database {
		ac, err := cfg.Ledger.Client(ctx, cfg.ProjectID, cfg.AuditDatabase)
		if err != nil {
			return fail(fmt.Errorf("FIRESTORE_AUDIT_DATABASE: %w", err))
		}
		f.close.Add(func(context.Context) error { return ac.Close() })
		lo.Audit = audit.New(ac, nil)
	}
	store, err := cfg.Ledger.Open(ctx, cfg.ProjectID, lo)
	if err != nil {
		return fail(err)
	}
	f.close.Add(func(context.Context) error { return store.Close() })
	ps, err := cfg.PubSub.OpenBroker(ctx, cfg.ProjectID)
	if err != nil {
		return fail(err)
	}
	f.close.Add(func(context.Context) error { return ps.Close() })
	seeker, timeSeeker := seekersOf(ps, cfg.ProjectID)
	h, err := New(Options{
		Archive: archive.New(store.Client(), archive.WithRetention(cfg.Retention), archive.WithSubscriptions(subs)),
		Ledger:  store, DB: pool, Publisher: ps, Topology: top, Subscriptions: subs, Databases: dbs,
		Seeker: seeker, TimeSeeker: timeSeeker,
		Auth: cfg.Auth, Audience: cfg.Audience, Token: cfg.Token, Writers: cfg.Writers, ReadOnly: cfg.ReadOnly, Archivers: cfg.Archivers,
		MaxRepushes: cfg.MaxRepushes, SentTimeout: cfg.SentTimeout, Logger: log, PushTargets: targets, PullConsumers: cfg.PullConsumers, Pauser: cfg.Pauser,
		TraceProject: traceProject(cfg),
	})
	if err != nil {
		return fail(err)
	}
	f.Handler = h
	return f, nil
}

// traceProject is where the console links traces: DLQREPLAY_TRACE_PROJECT,
// else the project when the function talks to Google rather than to the
// emulators.
func traceProject(cfg Config) string {
	if cfg.TraceProject != "" || cfg.PubSub.EmulatorHost != "" {
		return cfg.TraceProject
	}
	return cfg.ProjectID
}

// Function is the dlqreplay handler built by Build, with what it must
// close at shutdown.
type Function struct {
	http.Handler
	close instance.Closers
}

// Close closes the clients and pools Build opened.
func (f *Function) Close(ctx context.Context) error { return f.close.Close(ctx) }

// Databases turns the pools of the topology's databases (by name) into
// Options.Databases.
func Databases(pools map[string]*pgxpool.Pool) map[string]postgres.DBTX {
	out := make(map[string]postgres.DBTX, len(pools))
	for name, p := range pools {
		out[name] = p
	}
	return out
}
