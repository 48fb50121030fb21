package consume

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"github.com/relaybus/relaybus/internal/contract"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/flow"
	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/brokeropen"
	"github.com/relaybus/relaybus/internal/instance/claimopen"
	"github.com/relaybus/relaybus/internal/instance/pgopen"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/pull"
	"github.com/relaybus/relaybus/internal/pullengine"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/forward"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// The engines' interfaces, met by the ledger's notifying types (consume
// writes nothing in Firestore: the rollup does, from its notices).
var (
	_ consumer.Ledger = (*ledger.Recorder)(nil)
	_ relay.Ledger    = (*ledger.SendNotifier)(nil)
)

// Config is the consume function's configuration: one consumer (one
// deployment per consumer in production; Terraform sets these from the
// topology's consumer, as the local stack does).
type Config struct {
	instance.Env
	PubSub instance.PubSub
	// Ledger says whether attempts, and the sends of the child events
	// this consumer kicks, are recorded (LEDGER, LEDGER_BUDGET): through
	// rollup notices on ROLLUP_TOPIC, with no Firestore client (the rollup
	// writes the ledger).
	Ledger instance.Recording
	// DB is the consumer's database: inbox, attempts, projections, its
	// outbox for child events (DATABASE_URL).
	DB instance.Database
	// ClaimCheck is where the data of messages that travelled by claim
	// check is read from, and where the child events this consumer kicks
	// put theirs when over its threshold (CLAIM_CHECK_*; none when unset:
	// a message that names an object is then dead-lettered).
	ClaimCheck instance.ClaimCheck
	// ConsumerID is the consumer service (CONSUMER_ID, required).
	ConsumerID string `env:"CONSUMER_ID"`
	// Subscription is its subscription id (CONSUMER_SUBSCRIPTION).
	Subscription string `env:"CONSUMER_SUBSCRIPTION"`
	// Handler is the handler's name (CONSUMER_HANDLER, default projection).
	Handler string `env:"CONSUMER_HANDLER, default=projection"`
	// ForwardURL is the forward handler's target (FORWARD_URL).
	ForwardURL string `env:"FORWARD_URL"`
	// ForwardAuth is how the forward handler authenticates (FORWARD_AUTH:
	// none, google or hmac; default none).
	ForwardAuth string `env:"FORWARD_AUTH, default=none"`
	// ForwardAudience is the ID tokens' audience with FORWARD_AUTH=google
	// (FORWARD_AUDIENCE; FORWARD_URL when empty).
	ForwardAudience string `env:"FORWARD_AUDIENCE"`
	// ForwardSigningSecret is the signing secret with FORWARD_AUTH=hmac
	// (FORWARD_SIGNING_SECRET: "whsec_" + base64; several, space-separated,
	// all sign), in production from Secret Manager.
	ForwardSigningSecret string `env:"FORWARD_SIGNING_SECRET"`
	// ForwardersKey opens the signing secrets of the hmac forwarders added
	// at run time, with CONSUMER_HANDLER=forwarders. Empty: an hmac
	// forwarder's deliveries are answered 503 (redelivered) and logged.
	forward.Forwarders
	// ForwardTimeout bounds one forward (FORWARD_TIMEOUT, default 10s).
	ForwardTimeout time.Duration `env:"FORWARD_TIMEOUT, default=10s"`
	// ForwardBreakerThreshold is how many forwards in a row must find the
	// target down before the forward handler's circuit breaker opens
	// (FORWARD_BREAKER_THRESHOLD, default 5; -1 turns the breaker off).
	ForwardBreakerThreshold int `env:"FORWARD_BREAKER_THRESHOLD, default=5"`
	// ForwardBreakerCoolDown is how long the breaker first stays open
	// before one delivery probes the target (FORWARD_BREAKER_COOLDOWN,
	// default 5s); it doubles at each failed probe.
	ForwardBreakerCoolDown time.Duration `env:"FORWARD_BREAKER_COOLDOWN, default=5s"`
	// ForwardBreakerMaxCoolDown bounds the cool-down
	// (FORWARD_BREAKER_MAX_COOLDOWN, default 5m).
	ForwardBreakerMaxCoolDown time.Duration `env:"FORWARD_BREAKER_MAX_COOLDOWN, default=5m"`
	// ForwardProbe is the request that probes the forward target while its
	// breaker keeps the consumer's push subscription paused (FORWARD_PROBE:
	// "METHOD /path", "METHOD" or "/path"; default HEAD of FORWARD_URL;
	// the topology's forward_probe).
	ForwardProbe string `env:"FORWARD_PROBE"`
	// GapTimeout is how long a strict consumer's version gap may stay open
	// before it is reported (STRICT_GAP_TIMEOUT, default 10m).
	GapTimeout time.Duration `env:"STRICT_GAP_TIMEOUT, default=10m"`
	// MaxDeliveryAttempts is the subscription's dead-letter threshold
	// (CONSUMER_MAX_DELIVERY_ATTEMPTS, default 5).
	MaxDeliveryAttempts int `env:"CONSUMER_MAX_DELIVERY_ATTEMPTS, default=5"`
	// InboxRetention is how long inbox rows are kept (INBOX_RETENTION,
	// default 192h).
	InboxRetention time.Duration `env:"INBOX_RETENTION, default=192h"`
	// Mode is how deliveries arrive (CONSUMER_MODE): push (Pub/Sub push or
	// Eventarc POSTs them, the default) or pull (the function pulls
	// CONSUMER_SUBSCRIPTION itself from the broker TRANSPORT names, a
	// long-running worker from its start: see internal/pull; with
	// CONSUMER_HANDLER=forwarders, which needs it on NATS and refuses it on
	// Pub/Sub, every forwarder's subscription, one worker each).
	Mode string `env:"CONSUMER_MODE, default=push"`
	// PullMaxInFlight bounds the pull worker's deliveries at once
	// (PULL_MAX_IN_FLIGHT, default 16; keep it below the pool's size).
	PullMaxInFlight int `env:"PULL_MAX_IN_FLIGHT, default=16"`
	// MaxInFlight bounds the deliveries this instance handles at once
	// (CONSUMER_MAX_IN_FLIGHT, the topology's max_in_flight; 0, the
	// default, is no bound of consume's own: Cloud Run's concurrency
	// bounds push, PULL_MAX_IN_FLIGHT pull). In pull mode the worker runs
	// the lower of the two.
	MaxInFlight int `env:"CONSUMER_MAX_IN_FLIGHT"`
	// MaxPerSecond is the most deliveries a second this instance handles
	// (CONSUMER_MAX_PER_SECOND: its share of the topology's
	// max_per_second; 0, the default, is no limit). Deliveries are spaced
	// by a token bucket of one token (internal/flow).
	MaxPerSecond float64 `env:"CONSUMER_MAX_PER_SECOND"`
	// FlowWait bounds how long a pushed delivery over a limit waits for
	// its turn before consume answers 429 with Retry-After
	// (CONSUMER_FLOW_WAIT, default 5s; keep it well below the ack
	// deadline). A pulled one waits at most a second at a time
	// (PullFlowWait) and stays leased in between.
	FlowWait time.Duration `env:"CONSUMER_FLOW_WAIT, default=5s"`
	// ForwardersRefresh is how long CONSUMER_HANDLER=forwarders trusts its
	// copy of a forwarder's registry row (not read from the environment;
	// 0: DefaultForwardersRefresh). Tests shorten it.
	ForwardersRefresh time.Duration
	// PauseEvery is how often the consumer's pause flag is read, so how
	// long an operator's pause takes to reach this process (not read
	// from the environment; 0: inbox.DefaultPauseEvery). Tests shorten it.
	PauseEvery time.Duration
	// RollupTopic receives attempt notices (ROLLUP_TOPIC, default
	// relaybus.ledger.rollup).
	RollupTopic string `env:"ROLLUP_TOPIC, default=relaybus.ledger.rollup"`
}

func init() {
	functions.HTTP("consume", instance.Lazy("consume", instance.FromEnv(instance.Load[Config], Build)))
	// Built at start, not on the first request: in pull mode no request
	// comes, the worker is the function's work.
	instance.Warm("consume")
}

// Build is the consume function's one constructor, in production (from
// the environment), in the local stack and in tests: the handler named by
// cfg.Handler, the consumer's pool (every table migrated, the handler's
// own included), one Pub/Sub client (dead letters, rollup notices, kicks),
// the ledger unless it is off, the kicker of the handlers' child events
// (a relay of this database with the relay's defaults; the scheduled drain
// of this database is the relay function's) and the engine.
func Build(ctx context.Context, cfg Config) (*Handler, error) {
	if cfg.ConsumerID == "" {
		return nil, errors.New("config: CONSUMER_ID is required: the consumer service's name")
	}
	switch cfg.Mode {
	case ModePush, "":
	case ModePull:
		if cfg.Subscription == "" && cfg.Handler != HandlerForwarders {
			return nil, errors.New("config: CONSUMER_SUBSCRIPTION is required with CONSUMER_MODE=pull: the subscription to pull")
		}
	default:
		return nil, fmt.Errorf("config: CONSUMER_MODE=%q: want %s or %s", cfg.Mode, ModePush, ModePull)
	}
	switch {
	case cfg.FlowWait < 0:
		return nil, fmt.Errorf("config: CONSUMER_FLOW_WAIT=%s: must be above 0 (0 takes the default, %s)", cfg.FlowWait, DefaultFlowWait)
	case cfg.MaxInFlight < 0:
		return nil, fmt.Errorf("config: CONSUMER_MAX_IN_FLIGHT=%d: must be 0 (no bound) or more", cfg.MaxInFlight)
	case cfg.MaxPerSecond < 0 || cfg.MaxPerSecond != cfg.MaxPerSecond:
		return nil, fmt.Errorf("config: CONSUMER_MAX_PER_SECOND=%v: must be 0 (no limit) or more", cfg.MaxPerSecond)
	}
	log := cfg.Logger()
	probe, err := forward.ParseProbe(cfg.ForwardProbe)
	if err != nil {
		return nil, fmt.Errorf("config: FORWARD_PROBE: %w", err)
	}
	top, err := topology.Load(cfg.Topology)
	if err != nil {
		return nil, err
	}
	hc := HandlerConfig{ForwardProbe: probe, ConsumerID: cfg.ConsumerID, ForwardURL: cfg.ForwardURL,
		ForwardAuth: cfg.ForwardAuth, ForwardAudience: cfg.ForwardAudience, ForwardSecrets: strings.Fields(cfg.ForwardSigningSecret),
		ForwardTimeout: cfg.ForwardTimeout, GapTimeout: cfg.GapTimeout, Logger: log,
		ForwardBreaker: forward.BreakerOptions{Threshold: pushBreakerThreshold(cfg, top, log),
			CoolDown: cfg.ForwardBreakerCoolDown, MaxCoolDown: cfg.ForwardBreakerMaxCoolDown}}
	// The forwarders service builds one forward handler per forwarder of
	// its registry (forwarders.go), none here.
	forwarding := cfg.Handler == HandlerForwarders
	if forwarding {
		if err := forwardersMode(cfg); err != nil {
			return nil, err
		}
	}
	// Off until the broker and the pool are open: the breaker pauses the
	// service's own subscription (ordered push) or the consumer by its
	// flag (Eventarc).
	bp, bf := &breakerPause{}, &breakerFlag{}
	var h consumer.Handler
	if !forwarding {
		own := hc
		own.ForwardOnTransition = func(ctx context.Context, tr forward.Transition) {
			bp.transition(ctx, tr)
			bf.transition(ctx, tr)
		}
		if h, err = BuildHandler(cfg.Handler, own); err != nil {
			return nil, err
		}
	}
	// What Emit checks each child against: its topic's schema, its consumers.
	ctr, err := contract.New(contract.Options{Topology: top})
	if err != nil {
		return nil, err
	}
	flush, err := cfg.StartTelemetry(ctx, "consume") // before the pool, which traces its statements
	if err != nil {
		return nil, err
	}
	pool, err := pgopen.Open(ctx, cfg.DB, Migrations...)
	if err != nil {
		_ = flush(ctx)
		return nil, err
	}
	var closers instance.Closers
	closers.Add(flush) // first, so it is flushed last
	closers.Add(func(context.Context) error { pool.Close(); return nil })
	fail := func(err error) (*Handler, error) {
		_ = closers.Close(context.Background())
		return nil, err
	}
	if m, ok := h.(Migrator); ok {
		if err := m.Migrate(ctx, pool); err != nil {
			return fail(err)
		}
	}
	ps, err := brokeropen.Open(ctx, cfg.PubSub, cfg.ProjectID)
	if err != nil {
		return fail(err)
	}
	closers.Add(func(context.Context) error { return ps.Close() })
	if err := cfg.Ledger.Check(); err != nil {
		return fail(err)
	}
	o := consumer.Options{DB: pool, ConsumerID: cfg.ConsumerID, Subscription: cfg.Subscription, Handler: h,
		DeadLetters: ps, MaxDeliveryAttempts: cfg.MaxDeliveryAttempts, LedgerBudget: cfg.Ledger.Budget, Logger: log}
	if c, ok := top.Consumer(cfg.Subscription); ok {
		o.Emits = append([]string{}, c.Emits...) // where its account may publish the kick
	}
	o.Contract = ctr
	// The child events this consumer emits carry its Cloud Run revision
	// (K_REVISION, read with the telemetry's resource) as their source
	// version, unless they name one.
	o.SourceVersion = cfg.Telemetry.CloudRunRevision
	ro := relay.Options{DB: pool, Publisher: ps, Topology: top, LedgerBudget: cfg.Ledger.Budget, Logger: log}
	claims, closeClaims, err := claimopen.Open(ctx, cfg.ClaimCheck)
	if err != nil {
		return fail(err)
	}
	closers.Add(func(context.Context) error { return closeClaims() })
	if claims != nil {
		o.Claims, ro.Claims = claims, claims
	}
	if cfg.Ledger.On() {
		o.Ledger = ledger.NewRecorder(ps, ledger.RecorderOptions{Topic: cfg.RollupTopic, Levels: model.LevelsOf(top)})
		ro.Ledger = ledger.NewSendNotifier(ps, cfg.RollupTopic)
	}
	kicker, err := relay.New(ro)
	if err != nil {
		return fail(err)
	}
	closers.Add(kicker.Close)
	o.Kicker = kicker
	if forwarding {
		// Each forwarder's subscription is created with the topology's
		// defaults (internal/forwarders), its dead-letter threshold
		// included.
		o.MaxDeliveryAttempts = top.Defaults.MaxDeliveryAttempts
		flowWait := cmp.Or(cfg.FlowWait, DefaultFlowWait)
		if cfg.Mode == ModePull {
			flowWait = min(flowWait, PullFlowWait)
		}
		set := newForwarderSet(o, hc, flowWait, cmp.Or(cfg.InboxRetention, DefaultInboxRetention))
		if set.keys, err = forwarders.ParseKeys(cfg.ForwardersKey); err != nil {
			return fail(fmt.Errorf("config: %w", err))
		}
		set.refresh = cmp.Or(cfg.ForwardersRefresh, DefaultForwardersRefresh)
		set.pauseEvery = cfg.PauseEvery
		if push, ok := broker.As[broker.PushConfigurer](ps); ok {
			set.push = push // each forwarder's breaker pauses its subscription
		}
		fn := &Handler{Handler: set, close: []func(context.Context) error{set.Close, closers.Close}}
		if cfg.Mode == ModePull {
			// Workers first at shutdown: drained before the engines close.
			pl := startForwarderPullers(ctx, set, top, pull.Options{Source: ps, DeadLetters: ps, Project: cfg.ProjectID,
				MaxInFlight: cfg.PullMaxInFlight, Logger: log})
			fn.close = append([]func(context.Context) error{pl.Close}, fn.close...)
			log.Info("consume: pulling the forwarders added at run time", "transport", cfg.PubSub.Transport)
			return fn, nil
		}
		log.Info("consume: serving the forwarders added at run time")
		return fn, nil
	}
	engine, err := consumer.New(o)
	if err != nil {
		return fail(err)
	}
	fl := FlowLimits{MaxInFlight: cfg.MaxInFlight, MaxPerSecond: cfg.MaxPerSecond, MaxWait: cmp.Or(cfg.FlowWait, DefaultFlowWait)}
	if cfg.Mode == ModePull {
		fl.MaxWait = min(fl.MaxWait, PullFlowWait)
	}
	fn, err := New(Options{Engine: engine, DB: pool, InboxRetention: cfg.InboxRetention, Flow: fl, Logger: log, Pausable: true, PauseEvery: cfg.PauseEvery})
	if err != nil {
		return fail(err)
	}
	// At shutdown: a breaker's pause in progress, the engine's attempts
	// (New put it first), then the kicks, the ledger and the clients.
	if breakerPauses(bp, h, cfg, top, ps, pool, log) {
		fn.breaker = bp
		fn.close = append([]func(context.Context) error{bp.close}, fn.close...)
	}
	if breakerFlags(bf, h, cfg, top, ps, pool, fn.pauses, log) {
		fn.flag = bf
		fn.close = append([]func(context.Context) error{bf.close}, fn.close...)
	}
	fn.close = append(fn.close, func(ctx context.Context) error { return closers.Close(ctx) })
	if cfg.Mode == ModePull {
		po := pull.Options{Source: ps, Subscription: cfg.Subscription, Engine: pullEngine{pullengine.New(engine, fn.pauses), fn.gate}, DeadLetters: ps, Project: cfg.ProjectID,
			MaxInFlight: cfg.PullMaxInFlight, MaxAttempts: cfg.MaxDeliveryAttempts, Logger: log}
		if cfg.MaxInFlight > 0 && (po.MaxInFlight <= 0 || cfg.MaxInFlight < po.MaxInFlight) {
			po.MaxInFlight = cfg.MaxInFlight
		}
		if c, ok := top.Consumer(cfg.Subscription); ok {
			po.Paused = pullengine.Paused(fn.pauses, c.Topic)
			po.MinBackoff = time.Duration(c.MinBackoffSeconds) * time.Second
			po.MaxBackoff = time.Duration(c.MaxBackoffSeconds) * time.Second
			po.ExtendEvery = time.Duration(c.AckDeadlineSeconds) * time.Second / 3
		}
		w, err := pull.New(po)
		if err != nil {
			return fail(err)
		}
		// The worker runs until Close, which drains it (the deliveries in
		// flight finish and are acknowledged, the rest handed back) before
		// the engine and the clients close.
		wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan error, 1)
		go func() { done <- w.Run(wctx) }()
		log.Info("consume: pulling", "subscription", cfg.Subscription, "transport", cfg.PubSub.Transport)
		fn.close = append([]func(context.Context) error{func(ctx context.Context) error {
			stop()
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
				return fmt.Errorf("consume: pull worker still draining at shutdown: %w", ctx.Err())
			}
		}}, fn.close...)
	}
	return fn, nil
}

// DefaultFlowWait is CONSUMER_FLOW_WAIT's default: how long a pushed
// delivery over its consumer's flow-control limits waits for its turn.
const DefaultFlowWait = 5 * time.Second

// PullFlowWait bounds one wait of a pulled delivery at the flow-control
// gate: past it the worker keeps the message leased and offers it again
// after the gate's Retry-After, so a drain at shutdown waits no longer.
const PullFlowWait = time.Second

// pullEngine is the pull worker's engine (internal/pullengine: the
// consume engine and the consumer's pause) within the consumer's
// flow-control limits (a delivery the gate holds back is held: no attempt
// made or counted).
type pullEngine struct {
	next pull.Engine
	gate *flow.Gate
}

func (p pullEngine) Handle(ctx context.Context, d delivery.Delivery) pull.Answer {
	release, err := p.gate.Acquire(ctx)
	if err != nil {
		var le *flow.LimitError
		wait := PullFlowWait
		if errors.As(err, &le) {
			wait = le.RetryAfter
		}
		return pull.Answer{Status: http.StatusTooManyRequests, Code: CodeFlowLimited, Error: err.Error(), Held: true, RetryAfter: wait}
	}
	defer release()
	return p.next.Handle(ctx, d)
}

// Consumer modes CONSUMER_MODE names.
const (
	ModePush = "push"
	ModePull = "pull"
)

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
