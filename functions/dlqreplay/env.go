package dlqreplay

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/relaybus/relaybus/internal/privacy/topologyrules"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/brokeropen"
	"github.com/relaybus/relaybus/internal/instance/fsopen"
	"github.com/relaybus/relaybus/internal/instance/pgopen"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/forward"
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
	// Audience is the audiences an ID token may have, comma-separated
	// (DLQREPLAY_AUDIENCE: the service's URL, and for users' gcloud
	// tokens gcloud's client id); required by cloudrun, iam and token.
	Audience string `env:"DLQREPLAY_AUDIENCE"`
	// Token is the personal tokens of Auth=token, from Secret Manager
	// (DLQREPLAY_TOKEN): a JSON object from each holder's email to their
	// token (at least 32 characters), sent in the X-Relaybus-Token header.
	Token string `env:"DLQREPLAY_TOKEN"`
	// Roles grant the viewer, operator and admin roles, on everything or
	// on topics and consumers (DLQREPLAY_ROLES, a JSON list; see
	// ParseRoles), besides the topology's operators. Writers are admins of
	// everything (DLQREPLAY_WRITERS, comma-separated emails). With
	// neither, nobody may do anything. ReadOnly refuses every action
	// (DLQREPLAY_READ_ONLY, default false).
	Roles    string   `env:"DLQREPLAY_ROLES"`
	Writers  []string `env:"DLQREPLAY_WRITERS"`
	ReadOnly bool     `env:"DLQREPLAY_READ_ONLY, default=false"`
	// Archivers may POST /deadletters:archive (DLQREPLAY_ARCHIVERS; empty:
	// nobody): the DLQ monitors' push service account.
	Archivers []string `env:"DLQREPLAY_ARCHIVERS"`
	// RateLimit and RateBurst bound each caller's requests per second on
	// one instance (DLQREPLAY_RATE_LIMIT, default 10, 0 for no limit;
	// DLQREPLAY_RATE_BURST, default 40); past them, 429 with Retry-After.
	RateLimit float64 `env:"DLQREPLAY_RATE_LIMIT, default=10"`
	RateBurst int     `env:"DLQREPLAY_RATE_BURST, default=40"`
	// Groups, when set, checks the members of the groups roles name
	// instead of the Cloud Identity Groups API (the local stack and tests;
	// no variable).
	Groups GroupChecker
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
	// ForwardersURL is the forwarders consume service's URL
	// (DLQREPLAY_FORWARDERS_URL; Terraform sets it): each forward
	// consumer added at run time gets a subscription pushing to
	// <it>/<name> (with TRANSPORT=nats a durable consumer that service
	// pulls: the URL only says it is deployed). Empty: POST /forwarders
	// answers 501.
	ForwardersURL string `env:"DLQREPLAY_FORWARDERS_URL"`
	// ForwardersPushAccount is the service account whose OIDC token those
	// pushes carry (DLQREPLAY_FORWARDERS_PUSH_ACCOUNT), the audience being
	// ForwardersURL; empty: no token (the local stack).
	ForwardersPushAccount string `env:"DLQREPLAY_FORWARDERS_PUSH_ACCOUNT"`
	// ForwardersDatabase names the topology database that holds the
	// forwarders' registry, the forwarders service's
	// (DLQREPLAY_FORWARDERS_DATABASE, default main).
	ForwardersDatabase string `env:"DLQREPLAY_FORWARDERS_DATABASE, default=main"`
	// ForwardersKey seals the signing secrets of hmac forwarders (the
	// forwarders consume service holds the same). Empty: adding an hmac
	// forwarder answers 501.
	forward.Forwarders
	// ForwardersNoDeadLetterPolicy leaves their subscriptions without
	// Pub/Sub's dead-letter policy (the local stack on pstest; not read
	// from the environment).
	ForwardersNoDeadLetterPolicy bool
	// ForwarderSubscriptions, when set, creates and deletes the
	// forwarders' subscriptions (the local stack's delivery loop; not
	// read from the environment).
	ForwarderSubscriptions broker.SubscriptionAdmin
	// Retention is how long dead letters are kept (ARCHIVE_RETENTION,
	// default 720h): each gets deleteAt = archived + retention for
	// Firestore's TTL policy.
	Retention time.Duration `env:"ARCHIVE_RETENTION, default=720h"`
	// ArchiveMode is how the DLQ monitors' deliveries reach the archive
	// (ARCHIVE_MODE): push (each <topic>.dlq-monitor pushes to POST
	// /deadletters:archive, the default) or pull (the function pulls them
	// on the broker TRANSPORT names, which must be NATS, and provisions
	// the topology there at its start; Terraform's nats transport sets it).
	ArchiveMode string `env:"ARCHIVE_MODE, default=push"`
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
	// Built at start, not on the first request: with ARCHIVE_MODE=pull
	// the archive's feed runs whether or not an operator calls.
	instance.Warm("dlqreplay")
}

// Build is the dlqreplay function's one constructor, in production (from
// LoadConfig), in the local stack and in tests: the topology, the outbox
// pool (migrated), the pools of the other databases given, the ledger and
// its archive, one Pub/Sub client and the seeker. Close closes them.
func Build(ctx context.Context, cfg Config) (*Function, error) {
	if cfg.Retention <= 0 {
		return nil, fmt.Errorf("ARCHIVE_RETENTION=%s: want a positive duration such as 720h", cfg.Retention)
	}
	switch cfg.ArchiveMode {
	case ArchiveModePush, "":
	case ArchiveModePull:
		if cfg.PubSub.Transport != instance.TransportNATS {
			return nil, fmt.Errorf("config: ARCHIVE_MODE=pull needs TRANSPORT=nats (got %q): on Pub/Sub the DLQ monitors push", cfg.PubSub.Transport)
		}
	default:
		return nil, fmt.Errorf("config: ARCHIVE_MODE=%q: want %s or %s", cfg.ArchiveMode, ArchiveModePush, ArchiveModePull)
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
	fwKeys, err := forwarders.ParseKeys(cfg.ForwardersKey)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
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
	pool, err := pgopen.Open(ctx, cfg.DB, outbox.Migrations)
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
		p, err := pgopen.Open(ctx, instance.Database{URL: url})
		if err != nil {
			return fail(fmt.Errorf("%s: %w", d.EnvVar(), err))
		}
		f.close.Add(func(context.Context) error { p.Close(); return nil })
		dbs[d.Name] = p
	}
	lo := ledger.Options{Logger: log, Privacy: topologyrules.Of(top)}
	if cfg.AuditDatabase != "" && cfg.AuditDatabase != cfg.Ledger.Database {
		ac, err := fsopen.Client(ctx, cfg.Ledger, cfg.ProjectID, cfg.AuditDatabase)
		if err != nil {
			return fail(fmt.Errorf("FIRESTORE_AUDIT_DATABASE: %w", err))
		}
		f.close.Add(func(context.Context) error { return ac.Close() })
		lo.Audit = audit.New(ac, nil)
	}
	store, err := fsopen.Ledger(ctx, cfg.Ledger, cfg.ProjectID, lo)
	if err != nil {
		return fail(err)
	}
	f.close.Add(func(context.Context) error { return store.Close() })
	ps, err := brokeropen.Open(ctx, cfg.PubSub, cfg.ProjectID)
	if err != nil {
		return fail(err)
	}
	f.close.Add(func(context.Context) error { return ps.Close() })
	roles, err := ParseRoles(cfg.Roles)
	if err != nil {
		return fail(err)
	}
	groups := cfg.Groups
	if groups == nil && namesGroup(roles, top.Operators) {
		g, err := NewCloudIdentityGroups(ctx, 0)
		if err != nil {
			return fail(err)
		}
		groups = g
	}
	rate := cfg.RateLimit
	if rate == 0 {
		rate = -1 // DLQREPLAY_RATE_LIMIT=0: no limit
	}
	h, err := New(Options{
		Archive: archive.New(store.Client(), archive.WithRetention(cfg.Retention), archive.WithSubscriptions(subs),
			archive.WithPrivacy(topologyrules.Of(top), store.PrivacyKey())),
		Ledger: store, DB: pool, Publisher: ps, Topology: top, Subscriptions: subs, Databases: dbs,
		Broker: ps,
		Auth:   cfg.Auth, Audience: cfg.Audience, Token: cfg.Token, OnCloudRun: cfg.OnCloudRun(),
		Roles: roles, Writers: cfg.Writers, ReadOnly: cfg.ReadOnly, Archivers: cfg.Archivers, Groups: groups,
		RateLimit: rate, RateBurst: cfg.RateBurst,
		MaxRepushes: cfg.MaxRepushes, SentTimeout: cfg.SentTimeout, Logger: log, PushTargets: targets, PullConsumers: cfg.PullConsumers, Pauser: cfg.Pauser,
		TraceProject: traceProject(cfg),
		Forwarders: ForwardersOptions{URL: cfg.ForwardersURL, PushAccount: cfg.ForwardersPushAccount, Database: cfg.ForwardersDatabase,
			NoDeadLetterPolicy: cfg.ForwardersNoDeadLetterPolicy, Subscriptions: cfg.ForwarderSubscriptions, Keys: fwKeys,
			// JetStream has no push: the forwarders service pulls each one.
			Pull: cfg.PubSub.Transport == instance.TransportNATS},
	})
	if err != nil {
		return fail(err)
	}
	f.Handler = h
	if cfg.ArchiveMode == ArchiveModePull {
		stop, err := startArchiveFeed(ctx, ps, cfg.ProjectID, top, h, log)
		if err != nil {
			return fail(err)
		}
		f.close.Add(stop) // last, so it stops first
	}
	return f, nil
}

// namesGroup reports whether a binding grants a role to a group.
func namesGroup(lists ...[]Binding) bool {
	for _, l := range lists {
		for _, b := range l {
			if parseMember(b.Member).group {
				return true
			}
		}
	}
	return false
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
