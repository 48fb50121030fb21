// Package dlqreplay is the operators' HTTP API (JSON) and, under /console/,
// their web console, one handler:
//
//	GET    /whoami                     the caller, and whether they may write
//	GET    /overview                   ?window=: events by status, dead letters per topic and consumer,
//	                                   outbox backlog, the lag of each hop over the last hour
//	GET    /events                     ?status=&topic=&eventType=&service=&traceId=&aggregateId=&from=&to=&pageSize=&pageToken=
//	GET    /events/{id}                the event (a JSON payload as JSON), every attempt by consumer, its
//	                                   outbox state, parent, children, dead letters and whether a re-push is allowed
//	POST   /events/{id}:repush         {"consumer", "dryRun"}: re-enqueue through the outbox (docs/operations.md's re-push rules)
//	GET    /traces/{eventId}           the event's trace as a tree
//	GET    /scheduled                  ?limit=: the outboxes' scheduled events not yet published, by deliverAt
//	POST   /scheduled/{id}:cancel      {"reason"}: cancel a scheduled event before it is due (scheduled.go)
//	POST   /deadletters:archive        a DLQ delivery (push or Eventarc, from <topic>.dlq-monitor) is archived
//	GET    /deadletters                ?topic=&consumer=&reason=&eventId=&since=&until=&pageSize=&pageToken=&deleted=
//	                                   (without the messages' data: GET /deadletters/{id} has it)
//	GET    /deadletters/{id}           the letter, with its event's attempt history from the ledger
//	POST   /deadletters/{id}:replay    republish the original for the failed consumer only (attribute
//	                                   target_consumer); {"dryRun": true} says what would happen
//	POST   /deadletters:replay         {"topic", "consumer", "reason", "since", "until", "includeReplayed",
//	                                   "dryRun", "expect"}: every matching letter, each to its consumer;
//	                                   the dry run counts them, "expect" makes the replay refuse another count
//	DELETE /deadletters/{id}           keep it as a tombstone with who and when
//	GET    /catalog                    ?topic=: the event catalog: each topic's schema versions (their
//	                                   definitions and JSON Schemas), publishers and consumers (delivery,
//	                                   ordering, handler, emits, registry entry) (catalog.go)
//	GET    /consumers                  the topic_consumers registry, with each consumer's subscription
//	POST   /consumers                  {"topic", "consumerId", "enabled", "description", "sortOrder"}: add one
//	PATCH  /consumers/{topic}/{id}     {"enabled", "description", "sortOrder"}: change one
//	POST   /consumers/{topic}/{id}:enable
//	POST   /consumers/{topic}/{id}:disable
//	POST   /consumers/{topic}/{id}:pause   stop delivery without spending attempts: an ordered push
//	                                   consumer's push endpoint detached, any other by its own
//	                                   flag in its database (pause.go)
//	POST   /consumers/{topic}/{id}:resume  restore it (a flag's kept deliveries published again)
//	GET    /consumers/{topic}/{id}/delivery  whether it is paused
//	POST   /consumers/{topic}/{id}:rebuild {"time" | "snapshot", "aggregateType", "dryRun"}: pause, seek,
//	                                   clear its state (scope) and inbox in its database, resume (rebuild.go)
//	GET    /consumers/{topic}/{id}/gaps ?aggregateType=&aggregateId=&limit=: a strict consumer's open
//	                                   version gaps, oldest first, read from its own database
//	POST   /consumers/{topic}/{id}/gaps:skip {"aggregateType", "aggregateId", "version", "through",
//	                                   "reason"}: release a gap by skipping missing versions (gaps.go)
//	GET    /forwarders                 ?topic=: the forward consumers added at run time (forwarders.go)
//	POST   /forwarders                 {"name", "topic", "url", "auth", "audience", "filter", "maxInFlight",
//	                                   "maxPerSecond", "timeoutSeconds", "description"}: add one: its registry
//	                                   row, its topic_consumers entry, its subscription pushing to the
//	                                   forwarders consume service (on NATS a durable consumer that service
//	                                   pulls); it receives the topic's events from then on;
//	                                   with auth hmac the answer holds its signing secret, once
//	GET    /forwarders/{name}          one forwarder, with its subscription and push endpoint
//	PATCH  /forwarders/{name}          {"url", "auth", "audience", "maxInFlight", "maxPerSecond",
//	                                   "timeoutSeconds", "description", "rotateSecret"}: change it (topic and
//	                                   filter are fixed); a new signing secret is answered once
//	DELETE /forwarders/{name}          delete its subscription (delivery stops), its registry entry and row
//	GET    /audit                      ?action=&topic=&consumer=&outcome=&limit=: who did (or was refused, or
//	                                   read) what, newest first
//	POST   /subscriptions/{name}:seek  {"time": RFC 3339} or {"snapshot": name}: redeliver from there
//	POST   /snapshots                  {"name", "subscription"}: snapshot a subscription
//	GET    /snapshots                  the snapshots
//	POST   /replays                    {"topic", "consumer", "since", "until", "outcome", "errorClass",
//	                                   "errorCode", "rate", "dryRun", "expect"}: every event of the topic the
//	                                   consumer failed or dead-lettered in the window, counted (dryRun), or sent
//	                                   to it alone as a job at a bounded rate (jobs.go)
//	GET    /jobs                       ?state=&limit=: the replay jobs, newest first, with their progress
//	GET    /jobs/{id}                  one job's progress: matched, sent, failed, remaining, rate, ETA
//	POST   /jobs/{id}:run              {"seconds"}: work on the job for a slice inside this request (a job
//	                                   advances while its callers drive it), then answer its progress
//	POST   /jobs/{id}:cancel           stop it before its next send
//	POST   /backfills                  {"topic", "consumer", "since", "until", "aggregates", "rate", "database",
//	                                   "dryRun"}: deliver the topic's history to that consumer alone, through
//	                                   its own inbox (backfill.go); a dry run counts the events
//	GET    /backfills                  ?limit=: the backfills, newest first, with their progress
//	GET    /backfills/{id}             one backfill's progress: matched, queued, remaining, rate, ETA
//	POST   /backfills/{id}:run         {"seconds"}: queue its events at its rate for a slice inside this request
//	POST   /backfills/{id}:pause       stop queueing; :resume continues from its cursor; :cancel ends it
//	POST   /backfills/{id}:resume
//	POST   /backfills/{id}:cancel
//
// Subscriptions are named logically (<topic>.<service>-<role>); the
// SubscriptionMap (DLQREPLAY_SUBSCRIPTIONS) turns an Eventarc consumer's
// into the trigger's real subscription for seek and snapshots, and the
// real one Pub/Sub stamps on dead letters back into the consumer.
//
// Answers: errors are {"code", "message"} (400 answers add "fields", each
// with its rule); every parameter and body field is validated (length,
// charset, range) before anything else happens, unknown parameters and
// fields included; unknown routes answer a JSON 404, a known route with
// another method 405. An internal failure answers 500 (503 when a store is
// unreachable) with a request id and no internal detail: the detail is in
// the log under that id.
//
// Auth (DLQREPLAY_AUTH): cloudrun, iam, token or none (see the Auth*
// constants) names the caller; roles say what they may do (rights.go): a
// viewer reads, an operator replays, deletes, re-pushes, seeks, pauses and
// skips gaps, an admin also adds consumers, disables a topic's last one and
// rebuilds projections, each on everything or on some topics and
// consumers. The roles are granted in infra/topology.yaml (operators), in
// DLQREPLAY_ROLES, and DLQREPLAY_WRITERS makes its principals admins of
// everything; a caller with none is refused everything but GET /whoami,
// with 403 naming the right it lacks. DLQREPLAY_READ_ONLY refuses every
// action. POST /deadletters:archive needs a caller DLQREPLAY_ARCHIVERS
// lists (the DLQ monitors' push identity; empty: nobody), and under
// DLQREPLAY_AUTH=token is authenticated by the push subscription's OIDC
// token instead of a personal token, which push cannot send. Each caller
// has a rate limit (DLQREPLAY_RATE_LIMIT, 429 with Retry-After).
//
// The audit log (AuditLog) records every action before it is taken (an
// entry that cannot be written refuses the action) and its outcome after,
// every payload read (an event's, a dead letter's) before it is answered,
// and every refusal, each with the verified caller. Non-GET requests from
// another origin in a browser are refused (net/http.CrossOriginProtection).
// The handler works under http.StripPrefix.
package dlqreplay

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay/console"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	ledgerquery "github.com/relaybus/relaybus/internal/ledger/query"
	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/privacy"
	"github.com/relaybus/relaybus/internal/privacy/topologyrules"
	"github.com/relaybus/relaybus/internal/ratelimit"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/topology"
)

// Defaults of Options.
const (
	// DefaultMaxRepushes refuses a re-push once an event was re-pushed this often.
	DefaultMaxRepushes = 3
	// DefaultSentTimeout is how long a SENT event must wait before it may be re-pushed.
	DefaultSentTimeout = 10 * time.Minute
	// DefaultPauseSettle is how long a pause by a consumer's flag takes
	// to reach every consume instance: they read it once a second
	// (inbox.DefaultPauseEvery), and a delivery already past the check
	// finishes within its transaction.
	DefaultPauseSettle = 3 * time.Second
	// DefaultRateLimit is the requests per second one caller may make (per
	// instance), DefaultRateBurst how many at once: a console's page loads
	// a handful; a script that loops is slowed down.
	DefaultRateLimit = 10
	DefaultRateBurst = 40
)

// Options configure the API. Archive, Ledger, DB and Publisher are required.
type Options struct {
	Archive   *archive.Store
	Ledger    *ledger.Store
	DB        postgres.DBTX
	Publisher event.Publisher
	// Topology, when set, tells the consumers' delivery, handler and
	// database (dry runs, the registry view) and validates registry edits.
	Topology *topology.Topology
	// Subscriptions maps logical subscriptions to the real ones (nil: every
	// subscription is its logical name).
	Subscriptions *topology.SubscriptionMap
	// Databases holds the topology's databases by name (its inboxes,
	// projections and outboxes) for dry runs and outbox states. Nil means DB
	// holds all of them (one database, as the local stack runs).
	Databases map[string]postgres.DBTX
	// Auth is AuthCloudRun (OnCloudRun required), AuthIAM (the default),
	// AuthToken (Token required) or AuthNone. Audience is the audiences
	// (comma-separated) an ID token may have: required by every mode but
	// AuthNone.
	Auth, Audience string
	// Token is AuthToken's personal tokens: a JSON object from each
	// holder's name (their email) to their token, of at least 32
	// characters.
	Token string
	// OnCloudRun says the process runs on Cloud Run (K_SERVICE is set):
	// AuthCloudRun runs only there, and AuthToken's archive route takes a
	// token whose signature Cloud Run's IAM removed only there.
	OnCloudRun bool
	// KeysURL and KeysClient are where AuthIAM and AuthToken fetch the
	// keys that sign ID tokens (Google's, identity.GoogleKeysURL, when
	// empty); tests serve their own.
	KeysURL    string
	KeysClient *http.Client
	// Roles grant the roles (the topology's operators are added to them).
	// Writers are admins of everything (DLQREPLAY_WRITERS). Closed by
	// default: with neither, nobody may do anything. ReadOnly refuses
	// every action above a viewer's. Archivers may POST dead letters to
	// /deadletters:archive (empty: nobody).
	Roles     []Binding
	Writers   []string
	ReadOnly  bool
	Archivers []string
	// Groups checks the members of the groups roles are granted to
	// (CloudIdentityGroups); required when a binding names a group.
	Groups GroupChecker
	// Audit is the audit log (the ledger's, Ledger.Audit(), when nil).
	Audit AuditLog
	// RateLimit and RateBurst bound each caller's requests per second
	// (DefaultRateLimit and DefaultRateBurst when zero; off when
	// RateLimit is negative): past them, 429 with Retry-After.
	RateLimit float64
	RateBurst int
	// Broker, when set, serves seek, snapshots, pause, resume and rebuild
	// with the capabilities it has (shared/broker, asked with broker.As):
	// a TimeSeeker seeks to a time, a Snapshotter keeps snapshots and
	// seeks to them, a PushConfigurer pauses push consumers. What it
	// lacks answers 501 (NATS JetStream seeks to a time only).
	Broker broker.Broker
	// PushTargets are the push consumers' endpoints and OIDC identities by
	// logical subscription (DLQREPLAY_PUSH_TARGETS): what resume restores.
	PushTargets map[string]PushTarget
	// PullConsumers are the logical subscriptions deployed in pull mode
	// (DLQREPLAY_PULL_CONSUMERS; Terraform's pull_mode): declared push, but
	// pulled by a worker, so they have no push endpoint to pause.
	PullConsumers []string
	// Forwarders configure the forward consumers added at run time
	// (/forwarders; forwarders.go). Adding one needs Forwarders.URL and a
	// Broker that is a broker.SubscriptionAdmin.
	Forwarders ForwardersOptions
	// Pauser pauses and resumes consumers (pause, resume, rebuild); nil
	// with a Broker that is a PushConfigurer means a PushPauser over it
	// and PushTargets.
	Pauser Pauser
	// PauseSettle is how long a pause by a consumer's own flag takes to
	// reach every consume instance: a rebuild waits that long after
	// pausing before it seeks and clears (DefaultPauseSettle when zero).
	PauseSettle time.Duration
	// MaxRepushes and SentTimeout are the re-push rules (defaults above).
	MaxRepushes int
	SentTimeout time.Duration
	Logger      *slog.Logger
	// PrivacyKey hashes personal fields and data subject ids
	// (internal/privacy; PRIVACY_KEY): the console's redactions and
	// erasure's subject keys. Erasure is refused without it.
	PrivacyKey privacy.Key
	// EraseSteps are stores an erasure by subject goes through after the
	// outboxes, the ledger and the dead-letter archive (an event history,
	// for one).
	EraseSteps []privacy.Step
	// TraceProject, when set, is the Google Cloud project whose Cloud Trace
	// holds relaybus's traces: the console links each event's trace id
	// there. Empty: no link.
	TraceProject string
}

// New returns the API's handler: the front (front.go: authentication,
// rate limit, cross-origin protection, the role a route needs, error
// answers, request ids) before one handler per resource, each given only
// the stores it uses and the guard (the rights and audit checks), and the
// console mounted under /console/.
func New(o Options) (http.Handler, error) {
	if o.Archive == nil || o.Ledger == nil || o.DB == nil || o.Publisher == nil {
		return nil, errors.New("dlqreplay: Archive, Ledger, DB and Publisher are required")
	}
	if o.Auth == "" {
		o.Auth = AuthIAM
	}
	au, err := newAuthenticator(&o)
	if err != nil {
		return nil, err
	}
	archivers, err := parsePrincipals("DLQREPLAY_ARCHIVERS", o.Archivers)
	if err != nil {
		return nil, fmt.Errorf("dlqreplay: %w", err)
	}
	writers, err := parsePrincipals("DLQREPLAY_WRITERS", o.Writers)
	if err != nil {
		return nil, fmt.Errorf("dlqreplay: %w", err)
	}
	var bindings []Binding
	for _, w := range writers.list() {
		bindings = append(bindings, Binding{Member: w, Role: RoleAdmin})
	}
	bindings = append(bindings, o.Roles...)
	if o.Topology != nil {
		bindings = append(bindings, o.Topology.Operators...)
	}
	for i, b := range o.Roles {
		if b.Member == Anonymous { // the local stack's one caller
			b.Member = "anonymous@localhost"
		}
		if errs := b.Validate(fmt.Sprintf("Roles[%d]", i)); len(errs) > 0 {
			return nil, fmt.Errorf("dlqreplay: %w", errs[0])
		}
	}
	for _, b := range bindings {
		if parseMember(b.Member).group && o.Groups == nil {
			return nil, fmt.Errorf("dlqreplay: the role of %s needs its members looked up: set Groups (DLQREPLAY_GROUPS=cloudidentity)", b.Member)
		}
	}
	var limiter *ratelimit.Limiter
	switch {
	case o.RateLimit < 0:
	case o.RateLimit == 0:
		limiter = ratelimit.New(ratelimit.Options{Rate: DefaultRateLimit, Burst: DefaultRateBurst})
	default:
		limiter = ratelimit.New(ratelimit.Options{Rate: o.RateLimit, Burst: o.RateBurst})
	}
	if o.PauseSettle <= 0 {
		o.PauseSettle = DefaultPauseSettle
	}
	if o.MaxRepushes <= 0 {
		o.MaxRepushes = DefaultMaxRepushes
	}
	if o.SentTimeout <= 0 {
		o.SentTimeout = DefaultSentTimeout
	}
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	if len(bindings) == 0 {
		o.Logger.Warn("dlqreplay: no role is granted (infra/topology.yaml operators, DLQREPLAY_ROLES, DLQREPLAY_WRITERS): every request but GET /whoami is refused")
	}
	if o.Subscriptions == nil && o.Topology != nil {
		o.Subscriptions, _ = topology.NewSubscriptionMap(o.Topology, nil)
	}
	if pc, ok := broker.As[broker.PushConfigurer](o.Broker); ok && o.Pauser == nil {
		o.Pauser = &PushPauser{Push: pc, Subscriptions: o.Subscriptions, Targets: o.PushTargets}
	}
	if o.Audit == nil {
		o.Audit = o.Ledger.Audit()
	}

	// The stores, each handed to the resources that use it.
	reader := ledgerquery.New(o.Ledger.Client())
	registry := consumers.New(o.Ledger.Client(), consumers.Options{Audit: o.Ledger.Audit()})
	dbs := databases{main: o.DB, byName: o.Databases}
	pull := pullSet(o.PullConsumers)
	g := &guard{log: o.Audit, readOnly: o.ReadOnly, logger: o.Logger}

	s := &server{auth: au, bindings: bindings, groups: o.Groups, limiter: limiter, csrf: http.NewCrossOriginProtection(),
		guard: g, logger: o.Logger, readOnly: o.ReadOnly, traceProject: o.TraceProject}
	var consoleAuth func(http.ResponseWriter, *http.Request) bool
	if o.Auth != AuthToken {
		consoleAuth = s.consoleCaller
	}
	s.console = console.New(console.Options{Mount: consoleMount, Authenticate: consoleAuth})
	lt := &letters{store: o.Archive, publisher: o.Publisher, history: reader, registry: registry, topology: o.Topology,
		subs: o.Subscriptions, dbs: dbs, archivers: archivers, g: g, logger: o.Logger}
	if o.PrivacyKey.IsZero() {
		o.PrivacyKey = o.Ledger.PrivacyKey()
	}
	var rules privacy.Rules
	if o.Topology != nil {
		rules = topologyrules.Of(o.Topology)
	}
	pe := newPersonal(rules, o.PrivacyKey, dbs, o.Ledger, o.Archive, o.EraseSteps, g)
	ev := &events{personal: pe, reader: reader, ledger: o.Ledger, deadLetters: o.Archive, outbox: o.DB, dbs: dbs,
		maxRepushes: o.MaxRepushes, sentTimeout: o.SentTimeout, g: g, logger: o.Logger,
		scheduled: &scheduled{dbs: dbs, g: g, logger: o.Logger}}
	jobs := &replayJobs{client: o.Ledger.Client(), reader: reader, letters: lt, events: ev, topology: o.Topology, audit: o.Audit,
		g: g, logger: o.Logger, now: time.Now}
	s.jobs = jobs
	s.archiveFeed = archiveFeed{lt}
	co := &consumerRegistry{registry: registry, topology: o.Topology, subs: o.Subscriptions, pauser: o.Pauser, pull: pull, dbs: dbs,
		auditLog: o.Audit, g: g, logger: o.Logger}
	dl := &deliveryControl{broker: o.Broker, pauser: o.Pauser, topology: o.Topology, subs: o.Subscriptions, pull: pull,
		dbs: dbs, g: g, logger: o.Logger, publisher: o.Publisher, pauseSettle: o.PauseSettle}
	s.routes = append(routesOf(s, lt, ev, co, dl,
		&overview{reader: reader, deadLetters: o.Archive, dbs: dbs, logger: o.Logger},
		&auditView{log: o.Audit},
		&catalogView{topology: o.Topology, registry: registry, pull: pull, logger: o.Logger},
		jobs,
	), &route{"POST", "erasures", RoleAdmin, pe.erase})
	fw := &forwarderAPI{o: o.Forwarders, dbs: dbs, topology: o.Topology, registry: registry, auditLog: o.Audit, g: g, logger: o.Logger}
	if sa, ok := broker.As[broker.SubscriptionAdmin](o.Broker); ok {
		fw.subs = sa
	}
	if o.Forwarders.Subscriptions != nil {
		fw.subs = o.Forwarders.Subscriptions
	}
	co.forwarders, dl.forwarders = fw, fw // a forwarder is paused and listed as a push consumer
	s.routes = append(s.routes, forwarderRoutes(fw)...)
	s.routes = append(s.routes, backfillRoutes(&backfills{dbs: dbs, topology: o.Topology, g: g, forwarders: fw})...)
	return s, nil
}

// routesOf is the API's one route table, over its resources' handlers.
// Every route but whoami and the DLQ monitors' archive needs a role;
// actions check the one they need on their target (a dry run is a
// viewer's read). The package comment lists every route
// (TestRoutesAreDocumented).
func routesOf(s *server, lt *letters, ev *events, co *consumerRegistry, dl *deliveryControl, ov *overview, av *auditView, ca *catalogView, jb *replayJobs) routeTable {
	return routeTable{
		{"GET", "whoami", "", s.whoami},
		{"GET", "overview", RoleViewer, ov.get},
		{"GET", "events", RoleViewer, ev.list},
		{"GET", "events/{}", RoleViewer, ev.get},
		{"POST", "events/{}:repush", RoleViewer, ev.repush},
		{"GET", "traces/{}", RoleViewer, ev.trace},
		{"GET", "scheduled", RoleViewer, ev.scheduled.list},
		{"POST", "scheduled/{}:cancel", RoleViewer, ev.scheduled.cancel},
		{"POST", pushedRoute, "", lt.archive},
		{"POST", "deadletters:replay", RoleViewer, lt.replayBatch},
		{"GET", "deadletters", RoleViewer, lt.list},
		{"GET", "deadletters/{}", RoleViewer, lt.get},
		{"POST", "deadletters/{}:replay", RoleViewer, lt.replay},
		{"DELETE", "deadletters/{}", RoleOperator, lt.delete},
		{"GET", "catalog", RoleViewer, ca.get},
		{"GET", "consumers", RoleViewer, co.list},
		{"POST", "consumers", RoleAdmin, co.add},
		{"PATCH", "consumers/{}/{}", RoleOperator, co.change},
		{"POST", "consumers/{}/{}:enable", RoleOperator, co.enable},
		{"POST", "consumers/{}/{}:disable", RoleOperator, co.disable},
		{"POST", "consumers/{}/{}:pause", RoleOperator, dl.pause},
		{"POST", "consumers/{}/{}:resume", RoleOperator, dl.resume},
		{"POST", "consumers/{}/{}:rebuild", RoleViewer, dl.rebuild},
		{"GET", "consumers/{}/{}/delivery", RoleViewer, dl.deliveryState},
		{"GET", "consumers/{}/{}/gaps", RoleViewer, dl.listGaps},
		{"POST", "consumers/{}/{}/gaps:skip", RoleOperator, dl.skipGap},
		{"GET", "audit", RoleViewer, av.list},
		{"POST", "subscriptions/{}:seek", RoleOperator, dl.seek},
		{"POST", "snapshots", RoleOperator, dl.createSnapshot},
		{"GET", "snapshots", RoleViewer, dl.listSnapshots},
		{"POST", "replays", RoleViewer, jb.create},
		{"GET", "jobs", RoleViewer, jb.list},
		{"GET", "jobs/{}", RoleViewer, jb.get},
		{"POST", "jobs/{}:run", RoleOperator, jb.run},
		{"POST", "jobs/{}:cancel", RoleOperator, jb.cancel},
	}
}

// databases are the topology's databases dlqreplay reaches, by name:
// Options.Databases, or, when that is nil, Options.DB for every name (one
// database, as the local stack runs).
type databases struct {
	main   postgres.DBTX
	byName map[string]postgres.DBTX
}

// all returns the databases by name ({"main": main} when there is one).
func (d databases) all() map[string]postgres.DBTX {
	if d.byName == nil {
		return map[string]postgres.DBTX{"main": d.main}
	}
	return d.byName
}

// mustOf returns the database of a name all() listed.
func (d databases) mustOf(name string) postgres.DBTX {
	db, _ := d.of(name)
	return db
}

// declared returns the database of a name the topology declares, and
// whether it does and dlqreplay reaches it (of alone answers main for any
// name when main is the only database).
func (d databases) declared(top *topology.Topology, name string) (postgres.DBTX, bool) {
	if top != nil {
		if _, ok := top.Database(name); !ok {
			return nil, false
		}
	}
	return d.of(name)
}

// of returns the database of a name, and whether dlqreplay has it.
func (d databases) of(name string) (postgres.DBTX, bool) {
	if d.byName == nil {
		return d.main, true
	}
	db, ok := d.byName[name]
	return db, ok
}

// pullSet is the logical subscriptions deployed in pull mode
// (Options.PullConsumers).
type pullSet []string

// has reports whether sub is pulled.
func (p pullSet) has(sub string) bool {
	for _, s := range p {
		if s == sub {
			return true
		}
	}
	return false
}
