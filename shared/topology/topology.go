// Package topology reads infra/topology.yaml, the one declaration of relaybus's
// topics, consumers and delivery settings that Terraform, the local stack and
// the ledger's topic_consumers seeding all read.
//
// [Load] applies the defaults and validates everything, so code that holds a
// *Topology can use every field without checking it again: a consumer's
// AckDeadlineSeconds is set, its Delivery is push or eventarc, its names follow
// internal/names.
package topology

import (
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/event"
)

// EnvPath names the environment variable that points at the topology file.
const EnvPath = "RELAYBUS_TOPOLOGY"

// DefaultPath is the topology file's path relative to the repository root.
const DefaultPath = "infra/topology.yaml"

// Delivery modes.
const (
	// DeliveryPush is an ordered push subscription to the consume service.
	DeliveryPush = "push"
	// DeliveryEventarc is an Eventarc Pub/Sub trigger on the consume service.
	DeliveryEventarc = "eventarc"
)

// Forward authentication modes (Consumer.ForwardAuth; shared/forward's
// Auth* constants).
const (
	ForwardAuthNone   = "none"
	ForwardAuthGoogle = "google"
	ForwardAuthHMAC   = "hmac"
)

// Per-consumer defaults of the forward and strict settings.
const (
	DefaultForwardTimeoutSeconds = 10
	DefaultGapTimeoutSeconds     = 600
	// The forward handler's circuit breaker (forward.Default*).
	DefaultForwardBreakerThreshold          = 5
	DefaultForwardBreakerCoolDownSeconds    = 5
	DefaultForwardBreakerMaxCoolDownSeconds = 300
)

// Bounds of the flow-control fields (Consumer.MaxInFlight, MaxInstances,
// MaxPerSecond).
const (
	// MaxMaxInFlight is Cloud Run's highest container concurrency.
	MaxMaxInFlight = 1000
	// MaxMaxInstances bounds max_instances.
	MaxMaxInstances = 1000
	// MaxMaxPerSecond bounds max_per_second.
	MaxMaxPerSecond = 100000
)

// Built-in handler names; the consume binary may register more.
const (
	HandlerProjection = "projection"
	HandlerStrict     = "strict"
	HandlerForward    = "forward"
)

// TargetConsumerAttr is the message attribute that addresses a re-push or a
// dead-letter replay to one consumer. Every consumer subscription filters on
// it (see Consumer.Filter), so such a message reaches only that consumer.
const TargetConsumerAttr = "target_consumer"

// Topology is the whole declaration.
type Topology struct {
	Defaults Settings `yaml:"defaults"`
	Rollup   Rollup   `yaml:"rollup"`
	Relay    Relay    `yaml:"relay"`
	// Databases are the Postgres databases that hold an outbox: the relay
	// drains every one of them. When the file declares none, there is one,
	// MainDatabase.
	Databases []Database `yaml:"databases"`
	Topics    []Topic    `yaml:"topics"`
	// Operators grant the operations API's roles (functions/dlqreplay):
	// who may view, operate or administer which topics and consumers.
	Operators []Operator `yaml:"operators"`

	// Dir is the directory of the topology file (set by Load; empty for
	// Parse, meaning the working directory). Schema files are relative to it.
	Dir string `yaml:"-"`
}

// Operator roles (Operator.Role), each including the ones before it.
const (
	// RoleViewer reads: the events, their payloads, dead letters,
	// consumers, the audit log.
	RoleViewer = "viewer"
	// RoleOperator also acts on what already flows: replays and deletes
	// dead letters, re-pushes events, seeks, snapshots, pauses and resumes
	// consumers, skips gaps, enables and disables consumers (but not the
	// last enabled one of a topic).
	RoleOperator = "operator"
	// RoleAdmin also changes what flows: adds consumers, disables a
	// topic's last enabled consumer, rebuilds a consumer's projection.
	RoleAdmin = "admin"
)

// Operator grants a role to one Cloud Run IAM identity, on everything or
// on some topics and consumers.
type Operator struct {
	// Member is who: user:EMAIL, serviceAccount:EMAIL, group:EMAIL (its
	// members, looked up in Cloud Identity), or a bare email.
	Member string `yaml:"member" json:"member"`
	// Role is viewer, operator or admin.
	Role string `yaml:"role" json:"role"`
	// Topics and Consumers scope the role: on these topics (every consumer
	// of them) and on these consumer services (on every topic). Both
	// empty: everything.
	Topics    []string `yaml:"topics" json:"topics,omitempty"`
	Consumers []string `yaml:"consumers" json:"consumers,omitempty"`
}

// Validate checks an operator grant; where names it in errors.
func (o Operator) Validate(where string) []error {
	var errs []error
	kind, email, prefixed := strings.Cut(o.Member, ":")
	if !prefixed {
		email = o.Member
	}
	if (prefixed && kind != "user" && kind != "serviceAccount" && kind != "group") || !strings.Contains(email, "@") || strings.ContainsAny(email, " ,:") {
		errs = append(errs, fmt.Errorf("%s.member: must be user:EMAIL, serviceAccount:EMAIL, group:EMAIL or an email, not %q", where, o.Member))
	}
	switch o.Role {
	case RoleViewer, RoleOperator, RoleAdmin:
	default:
		errs = append(errs, fmt.Errorf("%s.role: must be viewer, operator or admin, not %q", where, o.Role))
	}
	for k, tp := range o.Topics {
		if err := names.ValidateTopic(tp); err != nil {
			errs = append(errs, fmt.Errorf("%s.topics[%d]: %w", where, k, err))
		}
	}
	for k, c := range o.Consumers {
		if err := names.ValidateConsumer(c); err != nil {
			errs = append(errs, fmt.Errorf("%s.consumers[%d]: %w", where, k, err))
		}
	}
	return errs
}

// MainDatabase is the database of the publish function and of every
// consumer that names none.
const MainDatabase = "main"

// Database is one Postgres database with an outbox in it.
type Database struct {
	// Name is [a-z][a-z0-9-]* (at most 30 characters); it names the
	// database's URL variable (EnvVar) and its Secret Manager secret.
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// OutboxTables are producers' own outbox tables in the database, of
	// relaybus_outbox's shape (its columns or a subset with every
	// required one): the deploy's migrate step attaches each as a door
	// into relaybus_outbox (outbox.AttachTables), so a row inserted into
	// one is published like any outbox row. Each is a lower-case SQL
	// identifier of at most 48 characters, not starting with relaybus_.
	OutboxTables []string `yaml:"outbox_tables"`
}

// EnvVar is the environment variable holding the database's URL:
// DATABASE_URL for MainDatabase, DATABASE_URL_<NAME> (upper case, - as _)
// for the others.
func (d Database) EnvVar() string {
	if d.Name == MainDatabase {
		return "DATABASE_URL"
	}
	return "DATABASE_URL_" + strings.ToUpper(strings.ReplaceAll(d.Name, "-", "_"))
}

// DirectEnvVar is the environment variable holding the database's direct
// URL, for migrations when EnvVar's is a transaction-mode pooler:
// DATABASE_DIRECT_URL for MainDatabase, DATABASE_DIRECT_URL_<NAME> for the
// others.
func (d Database) DirectEnvVar() string {
	return strings.Replace(d.EnvVar(), "DATABASE_URL", "DATABASE_DIRECT_URL", 1)
}

// Settings are the values a topic or consumer may override.
type Settings struct {
	AckDeadlineSeconds      int    `yaml:"ack_deadline_seconds"`
	MessageRetentionSeconds int    `yaml:"message_retention_seconds"`
	MinBackoffSeconds       int    `yaml:"min_backoff_seconds"`
	MaxBackoffSeconds       int    `yaml:"max_backoff_seconds"`
	MaxDeliveryAttempts     int    `yaml:"max_delivery_attempts"`
	Delivery                string `yaml:"delivery"`
	Role                    string `yaml:"role"`
	Handler                 string `yaml:"handler"`
	Encoding                string `yaml:"encoding"`
	// The flow-control defaults of every consumer (Consumer.MaxInFlight,
	// MaxPerSecond, MaxInstances); 0, the built-in default, is unset.
	MaxInFlight  int     `yaml:"max_in_flight"`
	MaxPerSecond float64 `yaml:"max_per_second"`
	MaxInstances int     `yaml:"max_instances"`
}

// Rollup configures the topic consume reports handled events on.
type Rollup struct {
	Topic    string `yaml:"topic"`
	Delivery string `yaml:"delivery"`
}

// Relay configures the Scheduler job that drains the outbox.
type Relay struct {
	Schedule               string `yaml:"schedule"`
	TimeBudgetSeconds      int    `yaml:"time_budget_seconds"`
	AttemptDeadlineSeconds int    `yaml:"attempt_deadline_seconds"`
}

// Topic is one Pub/Sub topic and its consumers.
type Topic struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// Encoding is json or protobuf: how events are written into message data.
	Encoding                string `yaml:"encoding"`
	MessageRetentionSeconds int    `yaml:"message_retention_seconds"`
	// Publishers, when set, are the only callers the publish function lets
	// write this topic: service account (or user) emails, as the ID token
	// Cloud Run verified names them (a serviceAccount: or user: prefix is
	// dropped). Empty: every caller Cloud Run admits.
	Publishers []string `yaml:"publishers"`
	// AggregateTypes are the aggregate types whose events this topic
	// carries (the topic's aggregate segment, the middle of
	// <domain>.<aggregate>.<category>, when left out). An aggregate's
	// versions are one sequence, published in order under one ordering
	// key, so an aggregate type belongs to one topic: no two topics may
	// declare the same one, and the publish function refuses an event whose
	// aggregateType is not one of its topic's, so a producer allowed on one
	// topic cannot take the versions (or block the events) of another
	// topic's aggregates.
	AggregateTypes []string `yaml:"aggregate_types"`
	// Ledger is how much the Firestore ledger keeps of the topic's events
	// (internal/ledger's Level): full (every attempt a document), failures
	// (the default when empty: the attempts of consumers that did not
	// succeed at once; a status and each consumer's outcome for every
	// event) or off (nothing).
	Ledger    string     `yaml:"ledger"`
	Consumers []Consumer `yaml:"consumers"`
	// Privacy says which payload fields are personal, which one names the
	// data subject, and what each place keeps (docs/privacy.md). Left out:
	// every place keeps payloads whole.
	Privacy Privacy `yaml:"privacy"`
	// Schemas are the payload schemas of the topic, one per schemaVersion
	// (internal/schema compiles them). A topic that declares any refuses an
	// event of a version it does not declare; a topic that declares none
	// takes any payload. All of a topic's schemas share one type and one
	// encoding: Pub/Sub attaches one schema, with one encoding, to a topic.
	Schemas []Schema `yaml:"schemas"`
	// HistoryRetentionDays is how long the outbox database's history keeps
	// the topic's events after the outbox's retention takes them
	// (docs/history.md): DefaultHistoryRetentionDays when left out, 0 for
	// no history, at most MaxHistoryRetentionDays.
	HistoryRetentionDays *int `yaml:"history_retention_days"`
}

// Bounds of a topic's history_retention_days.
const (
	DefaultHistoryRetentionDays = 90
	MaxHistoryRetentionDays     = 3650
)

// HistoryRetention is how long the history keeps the topic's events (0: none).
func (t Topic) HistoryRetention() time.Duration {
	days := DefaultHistoryRetentionDays
	if t.HistoryRetentionDays != nil {
		days = *t.HistoryRetentionDays
	}
	return time.Duration(days) * 24 * time.Hour
}

// Schema types (Schema.Type).
const (
	// SchemaProtobuf is a protobuf message from a .proto file; Terraform
	// creates a Pub/Sub PROTOCOL_BUFFER schema for it.
	SchemaProtobuf = "protobuf"
	// SchemaAvro is an Avro record schema (.avsc); Terraform creates a
	// Pub/Sub AVRO schema for it.
	SchemaAvro = "avro"
	// SchemaJSON is a JSON Schema (.json). Pub/Sub has no JSON Schema type,
	// so only relaybus's send paths check it.
	SchemaJSON = "jsonschema"
)

// Schema encodings (Schema.Encoding): how the payload is written, and the
// Pub/Sub topic's schema_settings encoding.
const (
	// SchemaEncodingJSON: the payload is JSON (protojson for protobuf).
	SchemaEncodingJSON = "json"
	// SchemaEncodingBinary: the payload is the schema type's binary encoding.
	SchemaEncodingBinary = "binary"
)

// Schema is the payload schema of one schemaVersion of a topic.
type Schema struct {
	// Version is the schemaVersion it describes: v1, v2, ...
	Version string `yaml:"version"`
	// Type is protobuf, avro or jsonschema.
	Type string `yaml:"type"`
	// File is the schema file, relative to the topology file's directory
	// (infra/): schemas/<topic>/<version>.proto for instance. A protobuf
	// file must be self-contained (no imports): Pub/Sub takes one file's text
	// as a schema definition.
	File string `yaml:"file"`
	// Message is the protobuf message's full name (package.Message); only
	// for type protobuf.
	Message string `yaml:"message"`
	// Encoding is json or binary: how producers write the payload and how
	// Pub/Sub validates it. protobuf takes either (json by default: the
	// protobuf JSON mapping), avro binary only (the default), jsonschema
	// json only.
	Encoding string `yaml:"encoding"`
}

// SchemaFor returns the topic's schema for a schemaVersion, or false.
func (t Topic) SchemaFor(version string) (Schema, bool) {
	for _, s := range t.Schemas {
		if s.Version == version {
			return s, true
		}
	}
	return Schema{}, false
}

// OwnedAggregateTypes returns the aggregate types the topic carries: its
// aggregate_types, else its aggregate segment (the second of its name's
// segments).
func (t Topic) OwnedAggregateTypes() []string {
	if len(t.AggregateTypes) > 0 {
		return t.AggregateTypes
	}
	if segs := strings.Split(t.Name, "."); len(segs) >= 2 {
		return segs[1:2]
	}
	return nil
}

// AggregateTopic returns the topic that carries an aggregate type: the
// declared topic that owns it (Topic.OwnedAggregateTypes), or false when
// no declared topic does.
func (t *Topology) AggregateTopic(aggregateType string) (string, bool) {
	for _, tp := range t.Topics {
		if slices.Contains(tp.OwnedAggregateTypes(), aggregateType) {
			return tp.Name, true
		}
	}
	return "", false
}

// PublisherEmails returns the topic's publishers as lower-cased emails,
// without their IAM member prefix.
func (t Topic) PublisherEmails() []string {
	out := make([]string, 0, len(t.Publishers))
	for _, p := range t.Publishers {
		if _, rest, ok := strings.Cut(p, ":"); ok {
			p = rest
		}
		out = append(out, strings.ToLower(strings.TrimSpace(p)))
	}
	return out
}

// Ledger levels a topic may declare (internal/ledger's Level).
const (
	LedgerFull     = "full"
	LedgerFailures = "failures"
	LedgerOff      = "off"
)

// tableName is a rebuild_clear entry: a lowercase table name, optionally
// schema-qualified.
var tableName = regexp.MustCompile(`^([a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,62}$`)

// Consumer is one consuming service's subscription to a topic.
type Consumer struct {
	Service     string `yaml:"service"`
	Role        string `yaml:"role"`
	Description string `yaml:"description"`
	Delivery    string `yaml:"delivery"`
	Handler     string `yaml:"handler"`
	ForwardURL  string `yaml:"forward_url"`
	// ForwardAuth is how the forward handler authenticates to forward_url
	// (FORWARD_AUTH): ForwardAuthNone (the default), ForwardAuthGoogle (a
	// Google-signed ID token for ForwardAudience) or ForwardAuthHMAC (a
	// Standard Webhooks signature with the secret in ForwardSecret).
	ForwardAuth string `yaml:"forward_auth"`
	// ForwardAudience is the ID tokens' audience with forward_auth google
	// (FORWARD_AUDIENCE; forward_url when empty).
	ForwardAudience string `yaml:"forward_audience"`
	// ForwardSecret names the Secret Manager secret holding the signing
	// secret(s) with forward_auth hmac; Terraform hands its latest version
	// to consume as FORWARD_SIGNING_SECRET.
	ForwardSecret string `yaml:"forward_secret"`
	// ForwardTimeoutSeconds bounds one forward (FORWARD_TIMEOUT, 10); for a
	// forward consumer it must be below the ack deadline.
	ForwardTimeoutSeconds int `yaml:"forward_timeout_seconds"`
	// ForwardBreakerThreshold is how many forwards in a row must find the
	// target down before the circuit breaker opens
	// (FORWARD_BREAKER_THRESHOLD, 5; -1 turns it off).
	ForwardBreakerThreshold int `yaml:"forward_breaker_threshold"`
	// ForwardBreakerCoolDownSeconds is how long the breaker first stays
	// open before a probe (FORWARD_BREAKER_COOLDOWN, 5).
	ForwardBreakerCoolDownSeconds int `yaml:"forward_breaker_cooldown_seconds"`
	// ForwardBreakerMaxCoolDownSeconds bounds the cool-down, which doubles
	// at each failed probe (FORWARD_BREAKER_MAX_COOLDOWN, 300).
	ForwardBreakerMaxCoolDownSeconds int `yaml:"forward_breaker_max_cooldown_seconds"`
	// ForwardProbe is the request that asks the target whether it is up
	// while the breaker keeps an ordered push consumer paused
	// (FORWARD_PROBE): "METHOD /path", "METHOD" or "/path", the method one
	// of GET, HEAD, POST, OPTIONS; empty is HEAD of forward_url.
	ForwardProbe string `yaml:"forward_probe"`
	// GapTimeoutSeconds is how long a strict consumer's version gap may
	// stay open before it is reported (STRICT_GAP_TIMEOUT, 600).
	GapTimeoutSeconds int `yaml:"gap_timeout_seconds"`
	// Database is the name of the consumer's Postgres database (its inbox,
	// projections and the outbox of its child events): one of the
	// topology's databases, MainDatabase by default.
	Database            string `yaml:"database"`
	AckDeadlineSeconds  int    `yaml:"ack_deadline_seconds"`
	MinBackoffSeconds   int    `yaml:"min_backoff_seconds"`
	MaxBackoffSeconds   int    `yaml:"max_backoff_seconds"`
	MaxDeliveryAttempts int    `yaml:"max_delivery_attempts"`
	// Emits are the topics the consumer's handler emits child events to
	// (consumer.Context.Emit): each must be a declared topic. The consume
	// service publishes its children right after its transaction commits
	// as its own service account, so Terraform grants that account
	// roles/pubsub.publisher on exactly these topics; a child on a topic
	// left out is refused by Pub/Sub and waits for the relay's next drain.
	Emits []string `yaml:"emits"`
	// ExtraFilter is the topology's filter field: ANDed with the replay filter.
	ExtraFilter string `yaml:"filter"`
	// RebuildClear declares how a custom handler's state is reset for a
	// rebuild (POST /consumers/{topic}/{id}:rebuild): the tables, in the
	// consumer's database, whose rows are all deleted in the rebuild's
	// transaction with its inbox rows. Unset, a custom handler's rebuild
	// says it cannot reset the state and stops before anything changes.
	// The built-in handlers' state is relaybus's and needs none.
	RebuildClear []string `yaml:"rebuild_clear"`
	// MaxInFlight is the most deliveries one consume instance of the
	// consumer handles at once: its Cloud Run container concurrency (push,
	// eventarc), its pull worker's bound (CONSUMER_MAX_IN_FLIGHT), the
	// local stack's bound on the consumer's route. The consumer's whole
	// ceiling is MaxInFlight × MaxInstances. 0 (the default) is unset:
	// Terraform's consume_settings.concurrency (pull: pull_mode's
	// max_in_flight) and the local stack's 64, as before.
	MaxInFlight int `yaml:"max_in_flight"`
	// MaxPerSecond is the most deliveries the consumer handles per second,
	// all its instances together: each instance takes an even share
	// (MaxPerSecond / its max instances) and spaces its deliveries by it
	// (CONSUMER_MAX_PER_SECOND), whatever the broker pushes. 0 (the
	// default) is unlimited.
	MaxPerSecond float64 `yaml:"max_per_second"`
	// MaxInstances is the most consume instances Cloud Run runs for the
	// consumer. 0 (the default) is unset: Terraform's
	// consume_settings.max_instances (pull: pull_mode.max_instances).
	MaxInstances int `yaml:"max_instances"`
	// Enabled defaults to true; a disabled consumer is not expected by the ledger.
	Enabled   *bool `yaml:"enabled"`
	SortOrder int   `yaml:"sort_order"`

	// Topic is the name of the topic the consumer is declared under (set by Load).
	Topic string `yaml:"-"`
}

// IsEnabled reports whether the consumer is enabled (the default).
func (c Consumer) IsEnabled() bool { return c.Enabled == nil || *c.Enabled }

// Subscription returns the consumer's subscription id: <topic>.<service>-<role>.
func (c Consumer) Subscription() string { return c.Topic + "." + c.Service + "-" + c.Role }

// DeadLetterTopic returns the consumer's dead-letter topic, <topic>.dlq.
func (c Consumer) DeadLetterTopic() string { return names.DeadLetter(c.Topic) }

// ReplayFilter is the Pub/Sub filter that lets a message through unless it is
// addressed (TargetConsumerAttr) to another consumer.
func (c Consumer) ReplayFilter() string {
	return fmt.Sprintf(`NOT attributes:%s OR attributes.%s = "%s"`, TargetConsumerAttr, TargetConsumerAttr, c.Service)
}

// Filter is the subscription's whole filter: the replay filter, ANDed with
// the topology's extra filter when there is one.
func (c Consumer) Filter() string {
	if c.ExtraFilter == "" {
		return c.ReplayFilter()
	}
	return "(" + c.ExtraFilter + ") AND (" + c.ReplayFilter() + ")"
}

// Load reads the topology from path, or, when path is empty, from
// infra/topology.yaml found by walking up from the working directory. The
// functions pass their RELAYBUS_TOPOLOGY (instance.Env.Topology).
func Load(path string) (*Topology, error) {
	if path == "" {
		p, err := find(DefaultPath)
		if err != nil {
			return nil, err
		}
		path = p
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read topology: %w", err)
	}
	t, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("topology %s: %w", path, err)
	}
	t.Dir = filepath.Dir(path)
	return t, nil
}

// find walks up from the working directory looking for rel.
func find(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no %s here or above, and $%s is not set", rel, EnvPath)
		}
		dir = parent
	}
}

// Parse decodes and validates a topology document, applying defaults.
// Unknown keys are errors, so a misspelt setting is not silently ignored.
func Parse(b []byte) (*Topology, error) {
	var t Topology
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	t.applyDefaults()
	if err := t.validate(); err != nil {
		return nil, err
	}
	return &t, nil
}

// Built-in defaults, the company's Pub/Sub conventions. A topology's defaults
// section overrides them.
var builtin = Settings{
	AckDeadlineSeconds:      60,
	MessageRetentionSeconds: 7 * 24 * 3600,
	MinBackoffSeconds:       10,
	MaxBackoffSeconds:       600,
	MaxDeliveryAttempts:     5,
	Delivery:                DeliveryPush,
	Role:                    "processor",
	Handler:                 HandlerProjection,
	Encoding:                string(event.EncodingJSON),
}

func orInt(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

func orStr(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

func (t *Topology) applyDefaults() {
	d := &t.Defaults
	d.AckDeadlineSeconds = orInt(d.AckDeadlineSeconds, builtin.AckDeadlineSeconds)
	d.MessageRetentionSeconds = orInt(d.MessageRetentionSeconds, builtin.MessageRetentionSeconds)
	d.MinBackoffSeconds = orInt(d.MinBackoffSeconds, builtin.MinBackoffSeconds)
	d.MaxBackoffSeconds = orInt(d.MaxBackoffSeconds, builtin.MaxBackoffSeconds)
	d.MaxDeliveryAttempts = orInt(d.MaxDeliveryAttempts, builtin.MaxDeliveryAttempts)
	d.Delivery = orStr(d.Delivery, builtin.Delivery)
	d.Role = orStr(d.Role, builtin.Role)
	d.Handler = orStr(d.Handler, builtin.Handler)
	d.Encoding = orStr(d.Encoding, builtin.Encoding)
	t.Rollup.Delivery = orStr(t.Rollup.Delivery, DeliveryPush)
	t.Relay.Schedule = orStr(t.Relay.Schedule, "* * * * *")
	t.Relay.TimeBudgetSeconds = orInt(t.Relay.TimeBudgetSeconds, 45)
	t.Relay.AttemptDeadlineSeconds = orInt(t.Relay.AttemptDeadlineSeconds, 120)
	if len(t.Databases) == 0 {
		t.Databases = []Database{{Name: MainDatabase, Description: "The outbox of the publish function and of every consumer."}}
	}
	for i := range t.Topics {
		tp := &t.Topics[i]
		tp.Encoding = orStr(tp.Encoding, d.Encoding)
		tp.MessageRetentionSeconds = orInt(tp.MessageRetentionSeconds, d.MessageRetentionSeconds)
		for k := range tp.Schemas {
			enc := SchemaEncodingJSON
			if tp.Schemas[k].Type == SchemaAvro {
				enc = SchemaEncodingBinary
			}
			tp.Schemas[k].Encoding = orStr(tp.Schemas[k].Encoding, enc)
		}
		for j := range tp.Consumers {
			c := &tp.Consumers[j]
			c.Topic = tp.Name
			c.Role = orStr(c.Role, d.Role)
			c.Delivery = orStr(c.Delivery, d.Delivery)
			c.Handler = orStr(c.Handler, d.Handler)
			c.Database = orStr(c.Database, MainDatabase)
			c.AckDeadlineSeconds = orInt(c.AckDeadlineSeconds, d.AckDeadlineSeconds)
			c.MinBackoffSeconds = orInt(c.MinBackoffSeconds, d.MinBackoffSeconds)
			c.MaxBackoffSeconds = orInt(c.MaxBackoffSeconds, d.MaxBackoffSeconds)
			c.MaxDeliveryAttempts = orInt(c.MaxDeliveryAttempts, d.MaxDeliveryAttempts)
			c.ForwardAuth = orStr(c.ForwardAuth, ForwardAuthNone)
			c.ForwardTimeoutSeconds = orInt(c.ForwardTimeoutSeconds, DefaultForwardTimeoutSeconds)
			c.ForwardBreakerThreshold = orInt(c.ForwardBreakerThreshold, DefaultForwardBreakerThreshold)
			c.ForwardBreakerCoolDownSeconds = orInt(c.ForwardBreakerCoolDownSeconds, DefaultForwardBreakerCoolDownSeconds)
			c.ForwardBreakerMaxCoolDownSeconds = orInt(c.ForwardBreakerMaxCoolDownSeconds, DefaultForwardBreakerMaxCoolDownSeconds)
			c.GapTimeoutSeconds = orInt(c.GapTimeoutSeconds, DefaultGapTimeoutSeconds)
			c.MaxInFlight = orInt(c.MaxInFlight, d.MaxInFlight)
			c.MaxInstances = orInt(c.MaxInstances, d.MaxInstances)
			if c.MaxPerSecond == 0 {
				c.MaxPerSecond = d.MaxPerSecond
			}
		}
	}
}

func (t *Topology) validate() error {
	var errs []error
	bad := func(where, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", where, fmt.Sprintf(format, args...)))
	}
	if err := names.ValidateTopic(t.Rollup.Topic); err != nil {
		bad("rollup.topic", "%v", err)
	}
	if !validDelivery(t.Rollup.Delivery) {
		bad("rollup.delivery", "must be push or eventarc, not %q", t.Rollup.Delivery)
	}
	if strings.TrimSpace(t.Relay.Schedule) == "" || len(strings.Fields(t.Relay.Schedule)) != 5 {
		bad("relay.schedule", "must be a five-field cron expression, not %q", t.Relay.Schedule)
	}
	if a := t.Relay.AttemptDeadlineSeconds; a < 15 || a > 1800 {
		bad("relay.attempt_deadline_seconds", "must be 15 to 1800 (Cloud Scheduler's limits for HTTP targets), not %d", a)
	}
	if b := t.Relay.TimeBudgetSeconds; b < 1 || b >= t.Relay.AttemptDeadlineSeconds {
		bad("relay.time_budget_seconds", "must be at least 1 and below attempt_deadline_seconds (%d), not %d", t.Relay.AttemptDeadlineSeconds, b)
	}
	seenDB := map[string]bool{}
	for i, db := range t.Databases {
		where := fmt.Sprintf("databases[%d] (%s)", i, db.Name)
		if !validDatabaseName(db.Name) {
			bad(where+".name", "must be a lowercase letter, then lowercase letters, digits or -, at most 30 characters")
		}
		if seenDB[db.Name] {
			bad(where, "database declared twice")
		}
		seenDB[db.Name] = true
		seenDoor := map[string]bool{}
		for j, tb := range db.OutboxTables {
			if !validOutboxTable(tb) {
				bad(fmt.Sprintf("%s.outbox_tables[%d]", where, j), "must be a lower-case SQL identifier ([a-z_][a-z0-9_]*, at most 48 characters) not starting with relaybus_, not %q", tb)
			}
			if seenDoor[tb] {
				bad(fmt.Sprintf("%s.outbox_tables[%d]", where, j), "%s listed twice", tb)
			}
			seenDoor[tb] = true
		}
	}
	if !seenDB[MainDatabase] {
		bad("databases", "must declare %q, the publish function's database", MainDatabase)
	}
	if len(t.Topics) == 0 {
		bad("topics", "declare at least one topic")
	}
	for i, o := range t.Operators {
		errs = append(errs, o.Validate(fmt.Sprintf("operators[%d]", i))...)
	}
	seenTopic := map[string]bool{t.Rollup.Topic: true}
	aggregateOwner := map[string]string{}
	for i, tp := range t.Topics {
		where := fmt.Sprintf("topics[%d] (%s)", i, tp.Name)
		if err := names.ValidateTopic(tp.Name); err != nil {
			bad(where, "%v", err)
		} else if names.IsDeadLetter(tp.Name) {
			bad(where, "dead-letter topics are derived (<topic>.dlq), do not declare them")
		}
		if seenTopic[tp.Name] {
			bad(where, "topic declared twice (or is the rollup topic)")
		}
		seenTopic[tp.Name] = true
		if _, err := event.ParseEncoding(tp.Encoding); err != nil {
			bad(where+".encoding", "%v", err)
		}
		for k, p := range tp.Publishers {
			kind, email, prefixed := strings.Cut(p, ":")
			if !prefixed {
				email = p
			}
			if (prefixed && kind != "serviceAccount" && kind != "user") || !strings.Contains(email, "@") || strings.ContainsAny(email, " ,") {
				bad(fmt.Sprintf("%s.publishers[%d]", where, k), "must be an email (a serviceAccount: or user: prefix is allowed), as the caller's ID token names it; groups and domains cannot be checked against a token, not %q", p)
			}
		}
		for k, at := range tp.AggregateTypes {
			if !event.ValidAggregateType(at) {
				bad(fmt.Sprintf("%s.aggregate_types[%d]", where, k), "%s, not %q", event.AggregateTypeRule, at)
			}
		}
		for _, at := range tp.OwnedAggregateTypes() {
			if other, ok := aggregateOwner[at]; ok && other != tp.Name {
				bad(where+".aggregate_types", "aggregate type %q is also %s's: an aggregate's versions are one ordered sequence, so its type belongs to one topic (declare aggregate_types on one of them)", at, other)
			}
			aggregateOwner[at] = tp.Name
		}
		switch tp.Ledger {
		case "", LedgerFull, LedgerFailures, LedgerOff:
		default:
			bad(where+".ledger", "must be full, failures or off, not %q", tp.Ledger)
		}
		if r := tp.MessageRetentionSeconds; r < 600 || r > 31*24*3600 {
			bad(where+".message_retention_seconds", "must be 600 (10 minutes) to 2678400 (31 days), not %d", r)
		}
		if r := tp.HistoryRetentionDays; r != nil && (*r < 0 || *r > MaxHistoryRetentionDays) {
			bad(where+".history_retention_days", "must be 0 (no history) to %d days, not %d", MaxHistoryRetentionDays, *r)
		}
		validateSchemas(where, tp.Schemas, bad)
		errs = append(errs, tp.Privacy.rule().Validate(where+".privacy")...)
		seenConsumer := map[string]bool{}
		for j, c := range tp.Consumers {
			cw := fmt.Sprintf("%s.consumers[%d] (%s)", where, j, c.Service)
			if err := names.ValidateConsumer(c.Service); err != nil {
				bad(cw+".service", "%v", err)
			}
			if err := names.ValidateRole(c.Role); err != nil {
				bad(cw+".role", "%v", err)
			}
			if seenConsumer[c.Service] {
				bad(cw, "consumer declared twice on this topic (topic_consumers is unique per topic and consumer)")
			}
			seenConsumer[c.Service] = true
			if n := len(c.Subscription()); n > 255 {
				bad(cw, "subscription name %q is %d characters, over Pub/Sub's 255", c.Subscription(), n)
			}
			if !validDelivery(c.Delivery) {
				bad(cw+".delivery", "must be push or eventarc, not %q", c.Delivery)
			}
			if !seenDB[c.Database] {
				bad(cw+".database", "must name one of the topology's databases, not %q", c.Database)
			}
			if c.Handler == HandlerForward && !strings.HasPrefix(c.ForwardURL, "http://") && !strings.HasPrefix(c.ForwardURL, "https://") {
				bad(cw+".forward_url", "the forward handler needs an http(s) URL")
			}
			if u, err := neturl.Parse(c.ForwardURL); c.Handler == HandlerForward && err == nil {
				if u.User != nil {
					bad(cw+".forward_url", "must not carry a user or password: the topology is baked into every image and shown in Terraform's plan (authenticate with forward_auth)")
				}
				if c.ForwardAuth != ForwardAuthNone && u.Scheme != "https" && !loopbackHost(u.Hostname()) {
					bad(cw+".forward_url", "must be https with forward_auth %s: the requests carry credentials (http:// only for a loopback target)", c.ForwardAuth)
				}
			}
			if c.Handler != HandlerForward && c.ForwardURL != "" {
				bad(cw+".forward_url", "only the forward handler uses forward_url (handler is %q)", c.Handler)
			}
			switch c.ForwardAuth {
			case ForwardAuthNone, ForwardAuthGoogle, ForwardAuthHMAC:
				if c.ForwardAuth != ForwardAuthNone && c.Handler != HandlerForward {
					bad(cw+".forward_auth", "only the forward handler uses forward_auth (handler is %q)", c.Handler)
				}
			default:
				bad(cw+".forward_auth", "must be none, google or hmac, not %q", c.ForwardAuth)
			}
			if c.ForwardAudience != "" && c.ForwardAuth != ForwardAuthGoogle {
				bad(cw+".forward_audience", "only forward_auth google uses forward_audience (the ID tokens' audience)")
			}
			if c.ForwardAuth == ForwardAuthHMAC && !validSecretID(c.ForwardSecret) {
				bad(cw+".forward_secret", "forward_auth hmac needs the Secret Manager secret id of the signing secret: 1 to 255 characters of [A-Za-z0-9_-]")
			}
			if c.ForwardSecret != "" && c.ForwardAuth != ForwardAuthHMAC {
				bad(cw+".forward_secret", "only forward_auth hmac uses forward_secret")
			}
			if f := c.ForwardTimeoutSeconds; f < 1 || (c.Handler == HandlerForward && f >= c.AckDeadlineSeconds) {
				bad(cw+".forward_timeout_seconds", "must be at least 1 and below ack_deadline_seconds (%d), not %d: a forward still calling when the ack deadline passes is redelivered", c.AckDeadlineSeconds, f)
			}
			if b := c.ForwardBreakerThreshold; b != -1 && (b < 1 || b > 1000) {
				bad(cw+".forward_breaker_threshold", "must be 1 to 1000, or -1 to turn the breaker off, not %d", b)
			}
			if cd := c.ForwardBreakerCoolDownSeconds; cd < 1 || cd > 3600 {
				bad(cw+".forward_breaker_cooldown_seconds", "must be 1 to 3600, not %d", cd)
			}
			if !validProbe(c.ForwardProbe) {
				bad(cw+".forward_probe", "must be \"METHOD /path\", \"METHOD\" or \"/path\" (METHOD one of GET, HEAD, POST, OPTIONS; the path starting with / and without spaces), not %q", c.ForwardProbe)
			}
			if m := c.ForwardBreakerMaxCoolDownSeconds; m < c.ForwardBreakerCoolDownSeconds || m > 3600 {
				bad(cw+".forward_breaker_max_cooldown_seconds", "must be forward_breaker_cooldown_seconds (%d) to 3600, not %d", c.ForwardBreakerCoolDownSeconds, m)
			}
			for j, tb := range c.RebuildClear {
				if !tableName.MatchString(tb) || strings.HasPrefix(tb, "relaybus_") {
					bad(fmt.Sprintf("%s.rebuild_clear[%d]", cw, j), "must be a table name (lowercase letters, digits and _, optionally schema-qualified) that is not relaybus's own (relaybus_*), not %q", tb)
				}
			}
			if g := c.GapTimeoutSeconds; g < 60 || g > 7*24*3600 {
				bad(cw+".gap_timeout_seconds", "must be 60 to 604800 (7 days), not %d", g)
			}
			if a := c.AckDeadlineSeconds; a < 10 || a > 600 {
				bad(cw+".ack_deadline_seconds", "must be 10 to 600, not %d", a)
			}
			if c.MinBackoffSeconds < 0 || c.MinBackoffSeconds > 600 {
				bad(cw+".min_backoff_seconds", "must be 0 to 600, not %d", c.MinBackoffSeconds)
			}
			if c.MaxBackoffSeconds < c.MinBackoffSeconds || c.MaxBackoffSeconds > 600 {
				bad(cw+".max_backoff_seconds", "must be min_backoff_seconds (%d) to 600, not %d", c.MinBackoffSeconds, c.MaxBackoffSeconds)
			}
			if m := c.MaxDeliveryAttempts; m < 5 || m > 100 {
				bad(cw+".max_delivery_attempts", "must be 5 to 100 (Pub/Sub's dead-letter limits), not %d", m)
			}
			if m := c.MaxInFlight; m < 0 || m > MaxMaxInFlight {
				bad(cw+".max_in_flight", "must be 1 to %d (Cloud Run's container concurrency), or 0 for Terraform's default, not %d", MaxMaxInFlight, m)
			}
			if m := c.MaxInstances; m < 0 || m > MaxMaxInstances {
				bad(cw+".max_instances", "must be 1 to %d, or 0 for Terraform's default, not %d", MaxMaxInstances, m)
			}
			if r := c.MaxPerSecond; r < 0 || r > MaxMaxPerSecond || r != r {
				bad(cw+".max_per_second", "must be above 0 and at most %d deliveries a second, or 0 for no limit, not %v", MaxMaxPerSecond, r)
			}
		}
	}
	for i, tp := range t.Topics {
		for j, c := range tp.Consumers {
			seen := map[string]bool{}
			for k, e := range c.Emits {
				ew := fmt.Sprintf("topics[%d] (%s).consumers[%d] (%s).emits[%d]", i, tp.Name, j, c.Service, k)
				switch {
				case seen[e]:
					bad(ew, "topic %q listed twice", e)
				case t.Topic(e) == nil:
					bad(ew, "must name one of the topology's topics (where the handler's child events go), not %q", e)
				}
				seen[e] = true
			}
		}
	}
	return errors.Join(errs...)
}

// validateSchemas checks a topic's schema declarations.
func validateSchemas(where string, schemas []Schema, bad func(where, format string, args ...any)) {
	seen := map[string]bool{}
	for k, s := range schemas {
		sw := fmt.Sprintf("%s.schemas[%d] (%s)", where, k, s.Version)
		if !validSchemaVersion(s.Version) {
			bad(sw+".version", "must be v followed by a number (v1, v2, ...), the events' schemaVersion, not %q", s.Version)
		}
		if seen[s.Version] {
			bad(sw+".version", "version declared twice on this topic")
		}
		seen[s.Version] = true
		switch s.Type {
		case SchemaProtobuf:
			if s.Message == "" {
				bad(sw+".message", "type protobuf needs the message's full name (package.Message)")
			}
		case SchemaAvro, SchemaJSON:
			if s.Message != "" {
				bad(sw+".message", "only type protobuf names a message")
			}
		default:
			bad(sw+".type", "must be protobuf, avro or jsonschema, not %q", s.Type)
		}
		switch {
		case s.File == "":
			bad(sw+".file", "required: the schema file, relative to the topology file's directory")
		case filepath.IsAbs(s.File) || strings.HasPrefix(filepath.ToSlash(filepath.Clean(s.File)), "../"):
			bad(sw+".file", "must be a relative path inside the topology file's directory (the image copies that directory), not %q", s.File)
		}
		switch s.Encoding {
		case SchemaEncodingJSON:
			if s.Type == SchemaAvro {
				bad(sw+".encoding", "avro takes encoding binary (the default): relaybus checks Avro's binary encoding; its JSON encoding is not supported")
			}
		case SchemaEncodingBinary:
			if s.Type == SchemaJSON {
				bad(sw+".encoding", "a jsonschema payload is JSON: encoding must be json")
			}
		default:
			bad(sw+".encoding", "must be json or binary, not %q", s.Encoding)
		}
		if k > 0 && (s.Type != schemas[0].Type || s.Encoding != schemas[0].Encoding) {
			bad(sw, "every schema of a topic has the same type and encoding (Pub/Sub attaches one schema and one encoding to a topic): %s/%s here, %s/%s for %s",
				s.Type, s.Encoding, schemas[0].Type, schemas[0].Encoding, schemas[0].Version)
		}
	}
}

// validSchemaVersion: v followed by a number, as event.Event's SchemaVersion.
func validSchemaVersion(v string) bool {
	if len(v) < 2 || len(v) > 16 || v[0] != 'v' {
		return false
	}
	for _, r := range v[1:] {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

func validDelivery(d string) bool { return d == DeliveryPush || d == DeliveryEventarc }

// validSecretID: a Secret Manager secret id, [A-Za-z0-9_-]{1,255}.
func validSecretID(s string) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '_' && r != '-' {
			return false
		}
	}
	return true
}

func validDatabaseName(n string) bool {
	if n == "" || len(n) > 30 || n[0] < 'a' || n[0] > 'z' || strings.HasSuffix(n, "-") {
		return false
	}
	for _, r := range n {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return false
		}
	}
	return true
}

// validOutboxTable is a Database.OutboxTables name: the door trigger's
// function is relaybus_door_<name>, within Postgres's 63 characters.
func validOutboxTable(n string) bool {
	if n == "" || len(n) > 48 || strings.HasPrefix(n, "relaybus_") || (n[0] >= '0' && n[0] <= '9') {
		return false
	}
	for _, r := range n {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' {
			return false
		}
	}
	return true
}

// Database returns the named database, or false.
func (t *Topology) Database(name string) (Database, bool) {
	for _, d := range t.Databases {
		if d.Name == name {
			return d, true
		}
	}
	return Database{}, false
}

// Topic returns the named topic, or nil.
func (t *Topology) Topic(name string) *Topic {
	for i := range t.Topics {
		if t.Topics[i].Name == name {
			return &t.Topics[i]
		}
	}
	return nil
}

// Consumers returns every consumer of every topic, in declaration order.
func (t *Topology) Consumers() []Consumer {
	var out []Consumer
	for _, tp := range t.Topics {
		out = append(out, tp.Consumers...)
	}
	return out
}

// Consumer returns the consumer whose subscription id is sub, or false.
func (t *Topology) Consumer(sub string) (Consumer, bool) {
	sub = names.ResourceID(sub)
	for _, c := range t.Consumers() {
		if c.Subscription() == sub {
			return c, true
		}
	}
	return Consumer{}, false
}

// EnabledConsumers returns the enabled consumers of a topic ordered by
// sort_order then service: the ledger's expected consumers for its events.
func (t *Topology) EnabledConsumers(topic string) []Consumer {
	tp := t.Topic(topic)
	if tp == nil {
		return nil
	}
	var out []Consumer
	for _, c := range tp.Consumers {
		if c.IsEnabled() {
			out = append(out, c)
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].SortOrder != out[j].SortOrder {
			return out[i].SortOrder < out[j].SortOrder
		}
		return out[i].Service < out[j].Service
	})
	return out
}

// loopbackHost reports whether host is this machine (localhost,
// 127.0.0.0/8, ::1).
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// InstancePerSecond is one instance's share of the consumer's
// MaxPerSecond when it runs on at most instances instances (its
// MaxInstances when set, else the deployment's default, instances): the
// rate each consume instance holds itself to, so that all of them
// together stay within MaxPerSecond. 0 when the consumer has no rate
// limit.
func (c Consumer) InstancePerSecond(instances int) float64 {
	if c.MaxPerSecond <= 0 {
		return 0
	}
	if c.MaxInstances > 0 {
		instances = c.MaxInstances
	}
	return c.MaxPerSecond / float64(max(instances, 1))
}

// probeRule is forward_probe's form (shared/forward.ParseProbe reads it).
var probeRule = regexp.MustCompile(`^((GET|HEAD|POST|OPTIONS)( +/\S*)?|/\S*)?$`)

// validProbe reports whether s is a forward_probe.
func validProbe(s string) bool { return probeRule.MatchString(strings.TrimSpace(s)) }
