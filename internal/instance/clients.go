package instance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/postgres"
	"github.com/relaybus/relaybus/internal/pull"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/transport"
	"github.com/relaybus/relaybus/shared/transport/natsjs"
)

// Logger returns the function's logger: LogHandler's when set, else JSON
// lines on stderr at LogLevel with Cloud Logging's trace correlation for
// the project.
func (e Env) Logger() *slog.Logger {
	if e.LogHandler != nil {
		return slog.New(e.LogHandler)
	}
	return logging.New(os.Stderr, logging.Options{Level: logging.ParseLevel(e.LogLevel), ProjectID: e.ProjectID})
}

// Open opens the database's pool (internal/postgres: refused and lost
// connections retried within the caller's deadline), with its statements
// traced when telemetry is on, and applies the migration lines (over
// DirectURL when set).
func (d Database) Open(ctx context.Context, lines ...migrate.Line) (*postgres.Pool, error) {
	return postgres.Open(ctx, postgres.Config{URL: d.URL, DirectURL: d.DirectURL, Tracer: postgres.QueryTracer()}, lines...)
}

// Open connects to Pub/Sub for project: the emulator at EmulatorHost when
// set, else Google's endpoint.
func (p PubSub) Open(ctx context.Context, project string) (*transport.Client, error) {
	if p.EmulatorHost != "" {
		return transport.Dial(ctx, project, p.EmulatorHost, transport.Options{})
	}
	return transport.New(ctx, project, transport.Options{})
}

// Transports TRANSPORT names.
const (
	TransportPubSub = "pubsub"
	TransportNATS   = "nats"
)

// Broker is the transport of the delivery paths (publish, relay, consume):
// *transport.Client for Pub/Sub, *natsjs.Client for NATS JetStream.
type Broker interface {
	// Publish is event.Publisher: single publishes (dead letters, rollup
	// notices).
	event.Publisher
	// PublishBatch is relay.Publisher: a key's run, in order.
	PublishBatch(ctx context.Context, topic string, msgs []event.Message) (int, error)
	// Pull is pull.Source: consume's pull mode.
	pull.Source
	Close() error
}

// OpenBroker connects to the broker TRANSPORT names: Pub/Sub for project
// (as Open does), or the NATS server at NATS_URL.
func (p PubSub) OpenBroker(ctx context.Context, project string) (Broker, error) {
	switch p.Transport {
	case TransportPubSub, "":
		c, err := p.Open(ctx, project)
		if err != nil {
			return nil, err
		}
		return c, nil
	case TransportNATS:
		if p.NATSURL == "" {
			return nil, errors.New("config: NATS_URL is required with TRANSPORT=nats: the NATS server's URL, e.g. nats://127.0.0.1:4222")
		}
		c, err := natsjs.Connect(ctx, p.NATSURL, natsjs.Options{Name: project})
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	return nil, fmt.Errorf("config: TRANSPORT=%q: want %s or %s", p.Transport, TransportPubSub, TransportNATS)
}

// Open opens the ledger of project with these settings; opts carries the
// caller's own (its logger).
func (l Ledger) Open(ctx context.Context, project string, opts ledger.Options) (*ledger.Store, error) {
	opts.Retention = l.Retention
	opts.ReconcileAfter = l.ReconcileAfter
	client, err := l.clientOptions()
	if err != nil {
		return nil, err
	}
	return ledger.Open(ctx, ledger.Config{ProjectID: project, Database: l.Database}, opts, client...)
}

// Client opens a Firestore client on another database of the project
// (the emulator's when EmulatorHost is set), for the operators' audit
// log's database of its own. The caller closes it.
func (l Ledger) Client(ctx context.Context, project, database string) (*firestore.Client, error) {
	client, err := l.clientOptions()
	if err != nil {
		return nil, err
	}
	c, err := firestore.NewClientWithDatabase(ctx, project, database, client...)
	if err != nil {
		return nil, fmt.Errorf("firestore client for %s/%s: %w", project, database, err)
	}
	return c, nil
}

// clientOptions are the Firestore client's options: none in production.
func (l Ledger) clientOptions() ([]option.ClientOption, error) {
	if l.EmulatorHost == "" {
		return nil, nil
	}
	// What the Firestore client does with FIRESTORE_EMULATOR_HOST (no
	// TLS, the emulator's admin credentials "Bearer owner"), on a
	// connection of our own passed last, so that it wins: when the
	// process environment names an emulator, firestore.NewClient
	// dials that one first and would ignore an endpoint option, so a
	// test or the local stack that runs its own emulator beside the
	// environment's would write to one and read from the other. The
	// client closes the connection with it.
	conn, err := grpc.NewClient(l.EmulatorHost,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(emulatorOwner{}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32)))
	if err != nil {
		return nil, fmt.Errorf("config: FIRESTORE_EMULATOR_HOST=%q: %w", l.EmulatorHost, err)
	}
	return []option.ClientOption{option.WithGRPCConn(conn)}, nil
}

// Check refuses a Mode other than firestore and off, naming LEDGER.
func (r Recording) Check() error {
	switch r.Mode {
	case ledger.ModeOff, ledger.ModeFirestore, "":
		return nil
	}
	return fmt.Errorf("LEDGER=%q: want %s or %s", r.Mode, ledger.ModeFirestore, ledger.ModeOff)
}

// On reports whether the ledger is recorded (Mode is not off).
func (r Recording) On() bool { return r.Mode != ledger.ModeOff }

// Open opens the ledger unless Mode is off (then it returns nil and no
// error).
func (r Recorder) Open(ctx context.Context, project string, opts ledger.Options) (*ledger.Store, error) {
	switch r.Mode {
	case ledger.ModeOff:
		return nil, nil
	case ledger.ModeFirestore, "":
		return r.Ledger.Open(ctx, project, opts)
	}
	return nil, fmt.Errorf("LEDGER=%q: want %s or %s", r.Mode, ledger.ModeFirestore, ledger.ModeOff)
}

// emulatorOwner authenticates to the Firestore emulator as its admin.
type emulatorOwner struct{}

func (emulatorOwner) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer owner"}, nil
}

func (emulatorOwner) RequireTransportSecurity() bool { return false }

// Closers closes what a constructor opened, last first: a function's
// Close, or the clean-up of a constructor that failed half-way.
type Closers []func(context.Context) error

// Add appends a close function.
func (c *Closers) Add(f func(context.Context) error) { *c = append(*c, f) }

// Close runs them all, last added first, and joins their errors.
func (c Closers) Close(ctx context.Context) error {
	var errs []error
	for i := len(c) - 1; i >= 0; i-- {
		errs = append(errs, c[i](ctx))
	}
	return errors.Join(errs...)
}
