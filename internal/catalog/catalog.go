// Package catalog is the catalog of relaybus's events: every topic, the
// payload schemas of its schema versions, who publishes to it and who
// consumes it (delivery mode, ordering, handler, what each handler emits),
// in one model built from the topology (shared/topology), its compiled
// schemas (internal/schema) and, where the caller has it, the live
// consumer registry (the ledger's topic_consumers).
//
// [Build] is pure: the operations API (functions/dlqreplay, GET /catalog)
// builds it per request over the registry it reads, the console shows it,
// and `relaybus catalog` writes it as an AsyncAPI 3.0 document
// ([Catalog.AsyncAPI]).
package catalog

import (
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/schema"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// Delivery modes of a consumer (Consumer.Delivery).
const (
	// DeliveryPush is an ordered push subscription to the consume service.
	DeliveryPush = topology.DeliveryPush
	// DeliveryEventarc is an Eventarc trigger: no transport ordering.
	DeliveryEventarc = topology.DeliveryEventarc
	// DeliveryPull is a push consumer deployed in pull mode (Terraform's
	// pull_mode): a worker in its consume service pulls an ordered
	// subscription.
	DeliveryPull = "pull"
)

// Handler kinds (Consumer.HandlerKind).
const (
	// KindProjection keeps the latest state per aggregate (newer versions only).
	KindProjection = topology.HandlerProjection
	// KindStrict applies every version in order, parking early ones.
	KindStrict = topology.HandlerStrict
	// KindForward POSTs each event as a CloudEvent to a URL.
	KindForward = topology.HandlerForward
	// KindRegistered is a handler the consume binary registers by name.
	KindRegistered = "registered"
)

// Publisher kinds (Publisher.Kind).
const (
	// PublisherHTTP is a caller the publish function admits for the topic
	// (the topic's publishers).
	PublisherHTTP = "http"
	// PublisherConsumer is a consumer whose handler emits child events to
	// the topic (its emits).
	PublisherConsumer = "consumer"
)

// Catalog is every topic's contract and its parties.
type Catalog struct {
	// Topics in the topology's order.
	Topics []Topic `json:"topics"`
	// RollupTopic is relaybus's own topic of handled-event notices; it is
	// internal and not in Topics.
	RollupTopic string `json:"rollupTopic"`
	// Registry says whether the live registry was read (Options.Registry
	// set): without it, Enabled is the topology's and Registration nil.
	Registry bool `json:"registry"`
}

// Topic is one topic's contract and its parties.
type Topic struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// AggregateTypes are the aggregate types whose events it carries; the
	// ordering key of each message is its aggregate id.
	AggregateTypes []string `json:"aggregateTypes"`
	// Mode is how an event is written into a message: "structured" (the
	// CloudEvent in message data, ContentType) or "binary" (a topic with a
	// Pub/Sub schema: the payload is the data, the CloudEvents context
	// ce-* attributes).
	Mode string `json:"mode"`
	// ContentType is the message data's media type in structured mode
	// (application/cloudevents+json or +protobuf); in binary mode, each
	// schema's PayloadType.
	ContentType string `json:"contentType"`
	// DeadLetterTopic is <topic>.dlq.
	DeadLetterTopic string `json:"deadLetterTopic"`
	// Ledger is what the ledger keeps of its events: full, failures, off.
	Ledger string `json:"ledger"`
	// MessageRetentionSeconds is the subscriptions' retention.
	MessageRetentionSeconds int `json:"messageRetentionSeconds"`
	// Schemas are the payload schemas by schemaVersion, oldest first;
	// none: the topic takes any payload.
	Schemas    []Schema    `json:"schemas"`
	Publishers []Publisher `json:"publishers"`
	Consumers  []Consumer  `json:"consumers"`
}

// Schema is one schemaVersion's payload schema.
type Schema struct {
	Version string `json:"version"`
	// Type is protobuf, avro or jsonschema; Encoding json or binary.
	Type     string `json:"type"`
	Encoding string `json:"encoding"`
	// File is relative to the topology file's directory.
	File string `json:"file"`
	// Message is a protobuf schema's message.
	Message string `json:"message,omitempty"`
	// PayloadType is the payloads' media type (datacontenttype).
	PayloadType string `json:"payloadType"`
	// Definition is the schema file's text, when compiled (Options.Schemas).
	Definition string `json:"definition,omitempty"`
	// JSONSchema is the payload's shape as JSON Schema (a jsonschema's own
	// document; a protobuf message's JSON mapping); none for Avro.
	JSONSchema map[string]any `json:"jsonSchema,omitempty"`
}

// Publisher is a party that sends events to a topic.
type Publisher struct {
	// Kind is PublisherHTTP or PublisherConsumer.
	Kind string `json:"kind"`
	// Name is the caller's email (http) or the consumer's service.
	Name string `json:"name"`
	// From is, for a consumer, the topic whose events its handler handles
	// when it emits.
	From string `json:"from,omitempty"`
}

// Consumer is one consumer of a topic.
type Consumer struct {
	Service      string `json:"service"`
	Role         string `json:"role"`
	Description  string `json:"description,omitempty"`
	Subscription string `json:"subscription"`
	// Delivery is push, eventarc or pull; Ordered whether the transport
	// keeps each aggregate's order (push and pull: an ordered
	// subscription; Eventarc: no, the handler's version gate does).
	Delivery string `json:"delivery"`
	Ordered  bool   `json:"ordered"`
	// Handler is the handler's name; HandlerKind projection, strict,
	// forward or registered.
	Handler     string `json:"handler"`
	HandlerKind string `json:"handlerKind"`
	// ForwardURL is a forward handler's target.
	ForwardURL string `json:"forwardUrl,omitempty"`
	// Database is where its inbox and projections are.
	Database string `json:"database"`
	// Emits are the topics its handler emits child events to.
	Emits []string `json:"emits"`
	// Enabled is whether new events expect it: the registry's answer
	// when it was read and has the consumer, else the topology's.
	Enabled             bool   `json:"enabled"`
	MaxDeliveryAttempts int    `json:"maxDeliveryAttempts"`
	DeadLetterTopic     string `json:"deadLetterTopic"`
	// Registration is its registry entry (nil: the registry was not read,
	// or lacks it).
	Registration *Registration `json:"registration,omitempty"`
	// InRegistry is whether the registry (when read: Catalog.Registry) has
	// the consumer; a declared one it lacks is not expected by events (the
	// deploy's sync has not run).
	InRegistry bool `json:"inRegistry"`
	// Declared is false for a registry entry the topology does not declare
	// (an operator added it): no subscription delivers to it, so events
	// expecting it wait for it. Such an entry has only Service, Enabled
	// and Registration.
	Declared bool `json:"declared"`
}

// Registration is a consumer's live registry entry.
type Registration struct {
	Topic      string    `json:"-"`
	ConsumerID string    `json:"-"`
	Enabled    bool      `json:"enabled"`
	UpdatedAt  time.Time `json:"updatedAt"`
	// UpdatedBy is the operator who last changed it (empty: the deploy's
	// sync wrote it, as the topology says).
	UpdatedBy string `json:"updatedBy,omitempty"`
}

// Options are what the catalog is built from besides the topology. Each is
// optional.
type Options struct {
	// Schemas are the topology's compiled schemas (schema.Load): they add
	// each version's definition and JSON Schema. Nil: the declarations
	// alone.
	Schemas *schema.Set
	// Registry is the live topic_consumers registry; nil: not read.
	Registry []Registration
	// PullConsumers are the logical subscriptions deployed in pull mode
	// (Terraform's pull_mode).
	PullConsumers []string
}

// Build assembles the catalog of top.
func Build(top *topology.Topology, o Options) *Catalog {
	c := &Catalog{Topics: []Topic{}, RollupTopic: top.Rollup.Topic, Registry: o.Registry != nil}
	reg := map[string]Registration{}
	for _, r := range o.Registry {
		reg[r.Topic+"/"+r.ConsumerID] = r
	}
	for _, tp := range top.Topics {
		t := Topic{Name: tp.Name, Description: tp.Description, AggregateTypes: tp.OwnedAggregateTypes(),
			Mode: "structured", ContentType: event.MediaTypeCloudEventsJSON, DeadLetterTopic: names.DeadLetter(tp.Name),
			Ledger: tp.Ledger, MessageRetentionSeconds: tp.MessageRetentionSeconds,
			Schemas: []Schema{}, Publishers: []Publisher{}, Consumers: []Consumer{}}
		if t.Ledger == "" {
			t.Ledger = topology.LedgerFailures
		}
		if tp.Encoding == string(event.EncodingProtobuf) {
			t.ContentType = event.MediaTypeCloudEventsProtobuf
		}
		for _, d := range sortedSchemas(tp.Schemas) {
			s := Schema{Version: d.Version, Type: d.Type, Encoding: d.Encoding, File: d.File, Message: d.Message, PayloadType: "application/json"}
			if d.Encoding == topology.SchemaEncodingBinary {
				s.PayloadType = schema.BinaryMediaType(d.Type)
			}
			if d.Type != topology.SchemaJSON { // Pub/Sub validates: binary mode
				t.Mode, t.ContentType = "binary", ""
			}
			if sc, ok := o.Schemas.For(tp.Name, d.Version); ok {
				s.Definition = string(sc.Definition)
				s.JSONSchema, _ = sc.JSONSchema()
			}
			t.Schemas = append(t.Schemas, s)
		}
		for _, p := range tp.PublisherEmails() {
			t.Publishers = append(t.Publishers, Publisher{Kind: PublisherHTTP, Name: p})
		}
		for _, other := range top.Topics {
			for _, oc := range other.Consumers {
				if slices.Contains(oc.Emits, tp.Name) {
					t.Publishers = append(t.Publishers, Publisher{Kind: PublisherConsumer, Name: oc.Service, From: other.Name})
				}
			}
		}
		for _, tc := range tp.Consumers {
			cc := Consumer{Service: tc.Service, Role: tc.Role, Description: tc.Description, Subscription: tc.Subscription(),
				Delivery: tc.Delivery, Ordered: tc.Delivery != topology.DeliveryEventarc, Handler: tc.Handler, HandlerKind: handlerKind(tc.Handler),
				ForwardURL: tc.ForwardURL, Database: tc.Database, Emits: append([]string{}, tc.Emits...), Enabled: tc.IsEnabled(),
				MaxDeliveryAttempts: tc.MaxDeliveryAttempts, DeadLetterTopic: tc.DeadLetterTopic(), Declared: true}
			if slices.Contains(o.PullConsumers, tc.Subscription()) {
				cc.Delivery = DeliveryPull
			}
			if r, ok := reg[tp.Name+"/"+tc.Service]; ok {
				cc.Registration, cc.InRegistry, cc.Enabled = &r, true, r.Enabled
			}
			t.Consumers = append(t.Consumers, cc)
		}
		for _, r := range o.Registry {
			if r.Topic == tp.Name && !slices.ContainsFunc(tp.Consumers, func(tc topology.Consumer) bool { return tc.Service == r.ConsumerID }) {
				t.Consumers = append(t.Consumers, Consumer{Service: r.ConsumerID, Emits: []string{}, Enabled: r.Enabled, Registration: &r, InRegistry: true})
			}
		}
		c.Topics = append(c.Topics, t)
	}
	return c
}

// Topic returns the named topic, or nil.
func (c *Catalog) Topic(name string) *Topic {
	for i := range c.Topics {
		if c.Topics[i].Name == name {
			return &c.Topics[i]
		}
	}
	return nil
}

// handlerKind says what kind of handler a name is.
func handlerKind(h string) string {
	switch h {
	case topology.HandlerProjection, topology.HandlerStrict, topology.HandlerForward:
		return h
	}
	return KindRegistered
}

// sortedSchemas returns the declarations oldest version first (v2 before v10).
func sortedSchemas(in []topology.Schema) []topology.Schema {
	out := append([]topology.Schema{}, in...)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := strings.TrimPrefix(out[i].Version, "v"), strings.TrimPrefix(out[j].Version, "v")
		if len(a) != len(b) {
			return len(a) < len(b)
		}
		return a < b
	})
	return out
}
