package instance

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/shared/topology"
)

// This file is the configuration loader: the one place relaybus reads its
// environment. Every function declares one configuration struct
// (github.com/sethvargo/go-envconfig tags) that embeds the pieces below,
// each declared once; Load fills it from the environment in production,
// and the local stack and tests start from Defaults and set their own
// values, so both reach the function's one constructor with the same type.

// Env holds the settings every function reads. Embed it in a function's
// own Config.
type Env struct {
	// ProjectID is the Google Cloud project (GOOGLE_CLOUD_PROJECT).
	ProjectID string `env:"GOOGLE_CLOUD_PROJECT"`
	// LogLevel is debug, info, warn or error (LOG_LEVEL, default info).
	LogLevel string `env:"LOG_LEVEL, default=info"`
	// Topology is the topology file's path (RELAYBUS_TOPOLOGY; empty means
	// topology.Load's search for infra/topology.yaml).
	Topology string `env:"RELAYBUS_TOPOLOGY"`
	// ShutdownTimeout bounds the graceful shutdown on SIGTERM
	// (SHUTDOWN_TIMEOUT, default 8s; Main serves with it).
	ShutdownTimeout time.Duration `env:"SHUTDOWN_TIMEOUT, default=8s"`
	// LogHandler, when set, receives the function's logs instead of the
	// JSON lines on stderr at LogLevel that production writes (the local
	// stack and tests set it; no variable).
	LogHandler slog.Handler
	// Telemetry is OpenTelemetry's set-up (the standard OTEL_* variables,
	// and TELEMETRY_EXPORT; see internal/otelsetup and docs/telemetry.md).
	Telemetry otelsetup.Config
}

// OnCloudRun reports whether the process runs on Cloud Run (K_SERVICE is
// set). The auth modes that trust Cloud Run's IAM refuse to start anywhere
// else.
func (e Env) OnCloudRun() bool { return e.Telemetry.CloudRunService != "" }

// StartTelemetry sets up the process's telemetry for the function named
// service (otelsetup.Setup: nothing unless an export is configured); its
// Shutdown, called when the function closes, flushes what is buffered.
// Call it before opening pools: they trace their statements.
func (e Env) StartTelemetry(ctx context.Context, service string) (otelsetup.Shutdown, error) {
	return otelsetup.Setup(ctx, otelsetup.Options{Config: e.Telemetry, ServiceName: service, ProjectID: e.ProjectID})
}

// Database is the function's own Postgres database: the topology's main
// database for publish, the relay (main's URL) and dlqreplay, the
// consumer's own for consume.
type Database struct {
	// URL is its connection string (DATABASE_URL, required): a
	// postgres:// URL or a keyword/value string with pgx's parameters
	// (pool_max_conns: the pool's size; pgx's default is max(4, CPUs)).
	URL string `env:"DATABASE_URL"`
	// DirectURL, when set, is where migrations run (DATABASE_DIRECT_URL):
	// the database itself when URL points at a transaction-mode pooler
	// (PgBouncer, Supabase's pooler), where the migrations' session-level
	// work cannot run.
	DirectURL string `env:"DATABASE_DIRECT_URL"`
}

// PubSub is how a function reaches its broker: Pub/Sub, or NATS
// JetStream with TRANSPORT=nats (internal/instance/brokeropen opens it).
type PubSub struct {
	// EmulatorHost is a Pub/Sub emulator or pstest to talk to without
	// credentials (PUBSUB_EMULATOR_HOST; empty in production: Google's
	// endpoint with the service's credentials).
	EmulatorHost string `env:"PUBSUB_EMULATOR_HOST"`
	// Transport is the broker the delivery paths publish to and pull from
	// (TRANSPORT: pubsub or nats, default pubsub).
	Transport string `env:"TRANSPORT, default=pubsub"`
	// NATSURL is the NATS server with TRANSPORT=nats (NATS_URL, e.g.
	// nats://nats.internal:4222).
	NATSURL string `env:"NATS_URL"`
	// NATSCreds is a NATS credentials file to connect with, with
	// TRANSPORT=nats (NATS_CREDS; on Cloud Run a Secret Manager secret
	// mounted as a file); empty: no credentials.
	NATSCreds string `env:"NATS_CREDS"`
}

// Ledger is where the Firestore ledger lives and how it keeps documents:
// every function reads it.
type Ledger struct {
	// Database is the Firestore database id (FIRESTORE_DATABASE, default
	// "(default)").
	Database string `env:"FIRESTORE_DATABASE, default=(default)"`
	// Retention is how long ledger documents are kept (LEDGER_RETENTION,
	// default 720h): their deleteAt for Firestore's TTL policy.
	Retention time.Duration `env:"LEDGER_RETENTION, default=720h"`
	// ReconcileAfter is how long after its last status change an event
	// that is not settled is due for the reconciler
	// (LEDGER_RECONCILE_AFTER, default 1m: ledger.DefaultReconcileAfter,
	// for a once-a-minute reconcile job).
	ReconcileAfter time.Duration `env:"LEDGER_RECONCILE_AFTER, default=1m"`
	// EmulatorHost is a Firestore emulator to talk to without credentials
	// (FIRESTORE_EMULATOR_HOST; empty in production).
	EmulatorHost string `env:"FIRESTORE_EMULATOR_HOST"`
	// PrivacyKey is the secret personal fields and data subject ids are
	// hashed with (PRIVACY_KEY, from Secret Manager; at least 16 bytes).
	// Empty: the local stack's public key, with a warning when the
	// topology declares privacy rules (docs/privacy.md).
	PrivacyKey string `env:"PRIVACY_KEY"`
}

// Recording is whether and how a delivery path records in the ledger,
// after the fact, within a budget. consume reads only this: it records
// through the rollup topic and opens no Firestore client.
type Recording struct {
	// Mode is firestore or off (LEDGER, default firestore).
	Mode string `env:"LEDGER, default=firestore"`
	// Budget bounds one batch of ledger writes (LEDGER_BUDGET, default
	// 10s).
	Budget time.Duration `env:"LEDGER_BUDGET, default=10s"`
}

// Recorder is the ledger of publish and the relay, which write it
// themselves: its database and its Recording.
type Recorder struct {
	Ledger
	Recording
}

// Load returns a configuration of type C read from the process
// environment by its env tags; an invalid value is an error naming the
// variable.
func Load[C any](ctx context.Context) (C, error) {
	var c C
	if err := envconfig.Process(ctx, &c); err != nil {
		return c, fmt.Errorf("config: %w", named(reflect.TypeOf(c), err))
	}
	return c, nil
}

// named rewrites go-envconfig's error, which names the Go field path
// ("Ledger: Budget: time: invalid duration ..."), to name the variable
// ("LEDGER_BUDGET: time: invalid duration ...").
func named(t reflect.Type, err error) error {
	rest := err.Error()
	for t.Kind() == reflect.Struct {
		name, after, ok := strings.Cut(rest, ": ")
		if !ok {
			break
		}
		f, found := t.FieldByName(name)
		if !found {
			break
		}
		if tag, ok := f.Tag.Lookup("env"); ok {
			v, _, _ := strings.Cut(tag, ",")
			return fmt.Errorf("%s: %s", strings.TrimSpace(v), after)
		}
		t, rest = f.Type, after
	}
	return err
}

// Defaults returns a configuration of type C holding only its documented
// defaults, read from no environment: what the local stack and tests start
// from before they set their own values.
func Defaults[C any]() C {
	var c C
	if err := envconfig.ProcessWith(context.Background(), &envconfig.Config{Target: &c, Lookuper: envconfig.MapLookuper(nil)}); err != nil {
		// Only a malformed default tag gets here: a programming error.
		panic(fmt.Sprintf("instance.Defaults[%T]: %v", c, err))
	}
	return c
}

// DatabaseURLs returns the URLs set for the named topology databases
// other than main, by name: DATABASE_URL_<NAME> (topology.Database.EnvVar;
// main's DATABASE_URL is a field of the functions' Config). A database
// whose variable is unset is left out.
func DatabaseURLs(names []string) map[string]string {
	return databaseVars(names, topology.Database.EnvVar)
}

// DatabaseDirectURLs is DatabaseURLs for the direct URLs, where migrations
// run when a database's URL is a transaction-mode pooler:
// DATABASE_DIRECT_URL_<NAME> (topology.Database.DirectEnvVar; main's
// DATABASE_DIRECT_URL is Database.DirectURL).
func DatabaseDirectURLs(names []string) map[string]string {
	return databaseVars(names, topology.Database.DirectEnvVar)
}

func databaseVars(names []string, variable func(topology.Database) string) map[string]string {
	out := make(map[string]string, len(names))
	for _, n := range names {
		n = strings.TrimSpace(n)
		if n == topology.MainDatabase {
			continue
		}
		if v, ok := os.LookupEnv(variable(topology.Database{Name: n})); ok && v != "" {
			out[n] = v
		}
	}
	return out
}

// FromEnv is a function's production path, for Lazy: its configuration
// from the environment (load), then its one constructor (build).
func FromEnv[C any, H http.Handler](load func(context.Context) (C, error), build func(context.Context, C) (H, error)) func(context.Context) (http.Handler, error) {
	return func(ctx context.Context) (http.Handler, error) {
		c, err := load(ctx)
		if err != nil {
			return nil, err
		}
		h, err := build(ctx, c)
		if err != nil {
			return nil, err
		}
		return h, nil
	}
}

// host is what Main reads besides the function's own configuration.
type host struct {
	Env
	// Port is where to listen (PORT, set by Cloud Run; default 8080).
	Port string `env:"PORT, default=8080"`
	// Target names the function to serve (FUNCTION_TARGET; default the
	// command's own).
	Target string `env:"FUNCTION_TARGET"`
}

// ClaimCheck is the claim check's configuration as the functions that
// publish or consume declare it (opened by internal/instance/claimopen):
// where message data over the threshold goes. Neither Bucket nor Dir
// set: no claim check.
type ClaimCheck struct {
	// Bucket is the Cloud Storage bucket the objects go in
	// (CLAIM_CHECK_BUCKET; STORAGE_EMULATOR_HOST points the client at an
	// emulator).
	Bucket string `env:"CLAIM_CHECK_BUCKET"`
	// Dir is a local directory the objects go in instead
	// (CLAIM_CHECK_DIR: the local stack's, and tests').
	Dir string `env:"CLAIM_CHECK_DIR"`
	// Threshold is the largest message data that travels inline
	// (CLAIM_CHECK_THRESHOLD, 1048576 bytes: claimcheck.DefaultThreshold).
	Threshold int `env:"CLAIM_CHECK_THRESHOLD, default=1048576"`
}

// Enabled says whether c names a store.
func (c ClaimCheck) Enabled() bool { return c.Bucket != "" || c.Dir != "" }
