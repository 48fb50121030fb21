package catalog

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/relaybus/relaybus/internal/pack"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// AsyncAPIVersion is the AsyncAPI specification version of
// Catalog.AsyncAPI's documents (https://www.asyncapi.com/docs/reference/specification/v3.0.0).
const AsyncAPIVersion = "3.0.0"

// Schema formats of AsyncAPI's Multi Format Schema Objects.
const (
	// FormatAvro is Avro's schema format.
	FormatAvro = "application/vnd.apache.avro+json;version=1.9.0"
	// FormatProtobuf is a .proto file's text, as the AsyncAPI parser's
	// protobuf schema parser reads it.
	FormatProtobuf = "application/vnd.google.protobuf;version=3"
)

// GooglePubSubBindingVersion is the version of the googlepubsub bindings
// the document uses (https://github.com/asyncapi/bindings/tree/master/googlepubsub).
const GooglePubSubBindingVersion = "0.2.0"

// Info is the document's info object.
type Info struct {
	// Title defaults to "relaybus events", Version to "0.0.0".
	Title, Version, Description string
}

// AsyncAPI is an AsyncAPI 3.0 document: fields in the specification's
// order, so the YAML and JSON it is written as read in that order.
type AsyncAPI struct {
	AsyncAPI           string               `json:"asyncapi" yaml:"asyncapi"`
	Info               AsyncInfo            `json:"info" yaml:"info"`
	DefaultContentType string               `json:"defaultContentType" yaml:"defaultContentType"`
	Servers            map[string]Server    `json:"servers" yaml:"servers"`
	Channels           map[string]Channel   `json:"channels" yaml:"channels"`
	Operations         map[string]Operation `json:"operations" yaml:"operations"`
	Components         Components           `json:"components" yaml:"components"`
}

// AsyncInfo is the info object.
type AsyncInfo struct {
	Title       string `json:"title" yaml:"title"`
	Version     string `json:"version" yaml:"version"`
	Description string `json:"description,omitempty" yaml:"description,omitempty"`
}

// Server is a server object.
type Server struct {
	Host        string `json:"host" yaml:"host"`
	Protocol    string `json:"protocol" yaml:"protocol"`
	Description string `json:"description,omitempty" yaml:"description,omitempty"`
}

// Ref is a reference object.
type Ref struct {
	Ref string `json:"$ref" yaml:"$ref"`
}

// Channel is a channel object: one topic.
type Channel struct {
	Address     string         `json:"address" yaml:"address"`
	Title       string         `json:"title,omitempty" yaml:"title,omitempty"`
	Description string         `json:"description,omitempty" yaml:"description,omitempty"`
	Servers     []Ref          `json:"servers" yaml:"servers"`
	Messages    map[string]Ref `json:"messages" yaml:"messages"`
	Bindings    map[string]any `json:"bindings,omitempty" yaml:"bindings,omitempty"`
	// Relaybus is x-relaybus: the topic's catalog entry's other facts.
	Relaybus map[string]any `json:"x-relaybus,omitempty" yaml:"x-relaybus,omitempty"`
}

// Operation is an operation object: the topic's send, or one consumer's
// receive.
type Operation struct {
	Action      string         `json:"action" yaml:"action"`
	Channel     Ref            `json:"channel" yaml:"channel"`
	Title       string         `json:"title,omitempty" yaml:"title,omitempty"`
	Summary     string         `json:"summary,omitempty" yaml:"summary,omitempty"`
	Description string         `json:"description,omitempty" yaml:"description,omitempty"`
	Messages    []Ref          `json:"messages" yaml:"messages"`
	Relaybus    map[string]any `json:"x-relaybus,omitempty" yaml:"x-relaybus,omitempty"`
}

// Components holds the messages the channels refer to.
type Components struct {
	Messages map[string]Message `json:"messages" yaml:"messages"`
}

// Message is a message object: one schema version of a topic's events.
type Message struct {
	Name          string         `json:"name" yaml:"name"`
	Title         string         `json:"title,omitempty" yaml:"title,omitempty"`
	Summary       string         `json:"summary,omitempty" yaml:"summary,omitempty"`
	Description   string         `json:"description,omitempty" yaml:"description,omitempty"`
	ContentType   string         `json:"contentType" yaml:"contentType"`
	Headers       map[string]any `json:"headers" yaml:"headers"`
	Payload       any            `json:"payload" yaml:"payload"`
	CorrelationID map[string]any `json:"correlationId" yaml:"correlationId"`
	Bindings      map[string]any `json:"bindings" yaml:"bindings"`
	// OrderingKey is x-ordering-key: where each message's ordering key
	// comes from.
	OrderingKey map[string]any `json:"x-ordering-key" yaml:"x-ordering-key"`
}

// AsyncAPI returns the catalog as an AsyncAPI 3.0 document: a channel per
// topic (its address the topic), a message per schema version (one
// message, any payload, for a topic with none) with its payload schema
// and the Pub/Sub attributes as headers, a send operation per topic (its
// publishers in x-relaybus) and a receive operation per consumer, named
// by its subscription (delivery, ordering, handler and emits in
// x-relaybus).
func (c *Catalog) AsyncAPI(info Info) *AsyncAPI {
	if info.Title == "" {
		info.Title = "relaybus events"
	}
	if info.Version == "" {
		info.Version = "0.0.0"
	}
	if info.Description == "" {
		info.Description = "The events relaybus carries, generated from the topology (infra/topology.yaml) and its schemas. " +
			"Every event is a CloudEvent; each message's ordering key is its aggregate id, so the events of one aggregate are delivered in version order to the consumers whose subscriptions are ordered."
	}
	doc := &AsyncAPI{AsyncAPI: AsyncAPIVersion, Info: AsyncInfo(info), DefaultContentType: event.MediaTypeCloudEventsJSON,
		Servers: map[string]Server{"pubsub": {Host: "pubsub.googleapis.com", Protocol: "googlepubsub",
			Description: "Google Cloud Pub/Sub, the production transport; the topics and subscriptions are named as here in the deployment's project"}},
		Channels: map[string]Channel{}, Operations: map[string]Operation{}, Components: Components{Messages: map[string]Message{}}}
	for _, t := range c.Topics {
		ch := Channel{Address: t.Name, Title: t.Name, Description: t.Description, Servers: []Ref{{Ref: "#/servers/pubsub"}}, Messages: map[string]Ref{},
			Relaybus: map[string]any{"aggregateTypes": t.AggregateTypes, "mode": t.Mode, "deadLetterTopic": t.DeadLetterTopic, "ledger": t.Ledger,
				"messageRetentionSeconds": t.MessageRetentionSeconds}}
		if t.Mode == "binary" && len(t.Schemas) > 0 {
			// The binding requires schemaSettings, so only a topic with a
			// Pub/Sub schema (Terraform names it after the topic) has one.
			ch.Bindings = map[string]any{"googlepubsub": map[string]any{
				"schemaSettings":           map[string]any{"name": t.Name, "encoding": strings.ToUpper(t.Schemas[0].Encoding)},
				"messageRetentionDuration": fmt.Sprintf("%ds", t.MessageRetentionSeconds), "bindingVersion": GooglePubSubBindingVersion}}
		}
		var refs []Ref
		msgs := t.messages()
		for _, m := range msgs {
			id := t.Name + "." + m.key
			doc.Components.Messages[id] = m.msg
			ch.Messages[m.key] = Ref{Ref: "#/components/messages/" + id}
			refs = append(refs, Ref{Ref: "#/channels/" + t.Name + "/messages/" + m.key})
		}
		doc.Channels[t.Name] = ch
		pubs := []map[string]any{}
		var who []string
		for _, p := range t.Publishers {
			x := map[string]any{"kind": p.Kind, "name": p.Name}
			if p.From != "" {
				x["from"] = p.From
				who = append(who, p.Name+" (handling "+p.From+")")
			} else {
				who = append(who, p.Name+" (over HTTP)")
			}
			pubs = append(pubs, x)
		}
		desc := "The relay publishes the events producers commit to their outbox (a Go producer's own transaction, the publish function's HTTP front door, a handler's child events), in each aggregate's version order."
		if len(who) > 0 {
			desc += " Declared publishers: " + strings.Join(who, ", ") + "."
		}
		doc.Operations[t.Name+".send"] = Operation{Action: "send", Channel: Ref{Ref: "#/channels/" + t.Name}, Title: "Publish to " + t.Name,
			Description: desc, Messages: refs, Relaybus: map[string]any{"publishers": pubs}}
		for _, cc := range t.Consumers {
			if !cc.Declared {
				continue // no subscription: nothing receives
			}
			order := "ordered by aggregate id (an ordered subscription)"
			if !cc.Ordered {
				order = "unordered transport (Eventarc); the handler's version gate keeps each aggregate's order"
			}
			doc.Operations[cc.Subscription] = Operation{Action: "receive", Channel: Ref{Ref: "#/channels/" + t.Name},
				Title: cc.Service + " (" + cc.Role + ")", Summary: cc.Description,
				Description: fmt.Sprintf("Subscription %s, %s delivery, %s; handler %s (%s). After %d delivery attempts a message goes to %s.",
					cc.Subscription, cc.Delivery, order, cc.Handler, cc.HandlerKind, cc.MaxDeliveryAttempts, cc.DeadLetterTopic),
				Messages: refs,
				Relaybus: map[string]any{"service": cc.Service, "role": cc.Role, "subscription": cc.Subscription, "delivery": cc.Delivery, "ordered": cc.Ordered,
					"handler": cc.Handler, "handlerKind": cc.HandlerKind, "database": cc.Database, "emits": cc.Emits, "enabled": cc.Enabled,
					"maxDeliveryAttempts": cc.MaxDeliveryAttempts, "deadLetterTopic": cc.DeadLetterTopic}}
		}
	}
	return doc
}

// keyedMessage is a message and its key in its channel.
type keyedMessage struct {
	key string
	msg Message
}

// messages returns the topic's messages: one per schema version, or one
// ("event") when it declares none.
func (t Topic) messages() []keyedMessage {
	if len(t.Schemas) == 0 {
		return []keyedMessage{{key: messageKey(nil), msg: t.message(nil)}}
	}
	out := make([]keyedMessage, 0, len(t.Schemas))
	for i := range t.Schemas {
		out = append(out, keyedMessage{key: messageKey(&t.Schemas[i]), msg: t.message(&t.Schemas[i])})
	}
	return out
}

// message describes the topic's messages of one schema version (s nil:
// of a topic without schemas).
func (t Topic) message(s *Schema) Message {
	version := event.DefaultSchemaVersion
	if s != nil {
		version = s.Version
	}
	m := Message{Name: t.Name + "." + version, Title: t.Name + " " + version,
		Headers: t.headers(s), CorrelationID: map[string]any{"description": "the correlation id shared by an event and the events it caused", "location": "$message.header#/correlation_id"},
		Bindings:    map[string]any{"googlepubsub": map[string]any{"bindingVersion": GooglePubSubBindingVersion}},
		OrderingKey: map[string]any{"header": event.AttrAggregateID, "description": "the ordering key is the event's aggregate id (the aggregate_id attribute, the CloudEvents subject): the relay publishes an aggregate's versions in order under it"}}
	if s == nil {
		m.Summary = "An event of " + t.Name + "; the topic declares no schema, so any payload is taken."
	} else {
		m.Summary = fmt.Sprintf("An event of %s with schemaVersion %s: a %s payload (%s), %s.", t.Name, s.Version, s.Type, s.Encoding, s.PayloadType)
	}
	payload := payloadSchema(s)
	if t.Mode == "binary" {
		m.ContentType = "application/json"
		if s != nil {
			m.ContentType = s.PayloadType
		}
		m.Description = "CloudEvents binary mode: the message data is the payload alone, validated by the topic's Pub/Sub schema; the CloudEvents context travels as ce-* attributes."
		m.Payload = payload
		return m
	}
	m.ContentType = t.ContentType
	m.Description = "CloudEvents structured mode: the message data is the whole CloudEvent (" + t.ContentType + "), its data the payload."
	if t.ContentType == event.MediaTypeCloudEventsProtobuf {
		m.Description += " The envelope is written in the CloudEvents protobuf format (io.cloudevents.v1.CloudEvent); its attributes and data are those below."
	}
	if ms, ok := payload.(map[string]any); ok {
		// A JSON Schema's local $refs point into its own document, which
		// is now the envelope's data.
		m.Payload = envelope(rebase(ms, "#/components/messages/"+t.Name+"."+messageKey(s)+"/payload/properties/data").(map[string]any))
	} else {
		// A binary payload's own schema format cannot sit inside a JSON
		// envelope; structured mode never carries one (a schema that is not
		// JSON Schema makes its topic binary).
		m.Payload = envelope(map[string]any{})
	}
	return m
}

// messageKey is a message's key in its channel: the schema version, or
// "event" for a topic without schemas.
func messageKey(s *Schema) string {
	if s == nil {
		return "event"
	}
	return s.Version
}

// rebase returns a copy of a JSON Schema with its local $refs ("#",
// "#/$defs/x") pointing at the same places under at, where the schema is
// embedded. Other $refs are left as they are.
func rebase(v any, at string) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, c := range x {
			if r, ok := c.(string); ok && k == "$ref" && (r == "#" || strings.HasPrefix(r, "#/")) {
				out[k] = at + strings.TrimPrefix(r, "#")
				continue
			}
			out[k] = rebase(c, at)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, c := range x {
			out[i] = rebase(c, at)
		}
		return out
	}
	return v
}

// payloadSchema is a schema version's payload as a schema object: its JSON
// Schema, or a Multi Format Schema Object for Avro and binary protobuf.
func payloadSchema(s *Schema) any {
	switch {
	case s == nil:
		return map[string]any{"description": "any payload: the topic declares no schema"}
	case s.Type == topology.SchemaAvro && s.Definition != "":
		var avsc any
		if err := json.Unmarshal([]byte(s.Definition), &avsc); err == nil {
			return map[string]any{"schemaFormat": FormatAvro, "schema": avsc}
		}
	case s.Type == topology.SchemaProtobuf && s.Encoding == topology.SchemaEncodingBinary && s.Definition != "":
		return map[string]any{"schemaFormat": FormatProtobuf, "schema": s.Definition}
	case s.JSONSchema != nil:
		return s.JSONSchema
	}
	return map[string]any{"description": fmt.Sprintf("a %s payload (%s); its schema file %s was not read", s.Type, s.Encoding, s.File)}
}

// envelope is a CloudEvent in the JSON format, data described by data.
func envelope(data map[string]any) map[string]any {
	props := map[string]any{"data": data}
	for _, a := range cloudEventAttributes {
		props[a.name] = map[string]any{"type": "string", "description": a.desc}
	}
	props["specversion"] = map[string]any{"type": "string", "const": event.SpecVersion, "description": "the CloudEvents version"}
	return map[string]any{"type": "object", "required": []any{"specversion", "id", "type", "source"}, "properties": props}
}

// headers describes the message attributes: relaybus's set, and the ce-*
// context attributes in binary mode.
func (t Topic) headers(s *Schema) map[string]any {
	props := map[string]any{}
	for _, a := range pubsubAttributes {
		props[a.name] = map[string]any{"type": "string", "description": a.desc}
	}
	if s != nil {
		props[event.AttrSchemaVersion] = map[string]any{"type": "string", "const": s.Version, "description": "the payload's schema version"}
		props[event.AttrContentType] = map[string]any{"type": "string", "description": "the payload's media type (" + s.PayloadType + ")"}
	}
	required := []any{event.AttrEventID, event.AttrEventType, event.AttrAggregateID}
	if t.Mode == "binary" {
		for _, a := range cloudEventAttributes {
			if a.name != "datacontenttype" { // binary mode: the content-type attribute
				props["ce-"+a.name] = map[string]any{"type": "string", "description": a.desc}
			}
		}
		props["ce-specversion"] = map[string]any{"type": "string", "const": event.SpecVersion, "description": "the CloudEvents version"}
		required = append(required, "ce-specversion", "ce-id", "ce-type", "ce-source")
	}
	return map[string]any{"type": "object", "description": "Pub/Sub message attributes", "required": required, "properties": props}
}

type attribute struct{ name, desc string }

// pubsubAttributes are relaybus's message attributes (shared/event's Attr*).
var pubsubAttributes = []attribute{
	{event.AttrContentType, "the payload's media type"},
	{event.AttrEventID, "the event's id (CloudEvents id)"},
	{event.AttrEventType, "the event's type, past tense: order.purchased (CloudEvents type)"},
	{event.AttrAggregateID, "the aggregate's id: the ordering key (CloudEvents subject)"},
	{event.AttrAggregateType, "the aggregate's type"},
	{event.AttrVersion, "the aggregate's version the event makes, 1, 2, ... (decimal)"},
	{event.AttrOccurredAt, "when it happened, RFC 3339 (CloudEvents time)"},
	{event.AttrSchemaVersion, "the payload's schema version, v1, v2, ..."},
	{event.AttrTraceID, "the W3C trace id, when traced"},
	{event.AttrSpanID, "the producing span's id, when traced"},
	{event.AttrCorrelationID, "the correlation id, when set"},
	{event.AttrSourceVersion, "the producer's own version (release, build or revision), when set"},
	{event.AttrCausationID, "the id of the event whose handler emitted this one"},
	{event.AttrUserID, "the initiating user, when known"},
	{event.AttrSourceService, "the producing service (CloudEvents source)"},
	{event.AttrExpireAt, "after this time (RFC 3339) the event is not consumed but EXPIRED"},
	{topology.TargetConsumerAttr, "set on a re-push or a dead-letter replay: only this consumer takes the message"},
	{pack.Attr, "set on a pack, several re-pushes of one aggregate to one consumer in one message: how many (decimal)"},
}

// cloudEventAttributes are the CloudEvents context and extension
// attributes relaybus writes (event.CloudEventAttributes), specversion
// aside.
var cloudEventAttributes = []attribute{
	{"id", "the event's id"},
	{"type", "the event's type"},
	{"source", "the producing service"},
	{"subject", "the aggregate id (the ordering key)"},
	{"time", "when it happened, RFC 3339"},
	{"datacontenttype", "the payload's media type"},
	{event.ExtTopic, "the topic"},
	{event.ExtAggregateType, "the aggregate's type"},
	{event.ExtVersion, "the aggregate's version (decimal)"},
	{event.ExtSchemaVersion, "the payload's schema version"},
	{event.ExtTraceID, "the W3C trace id"},
	{event.ExtSpanID, "the producing span's id"},
	{event.ExtCausationID, "the id of the event whose handler emitted this one"},
	{event.ExtCorrelationID, "the correlation id"},
	{event.ExtSourceVersion, "the producer's own version"},
	{event.ExtInitiatorService, "the initiating service"},
	{event.ExtInitiatorOperation, "the initiating operation"},
	{event.ExtInitiatorUserID, "the initiating user"},
	{event.ExtInitiatorRequestID, "the initiating request's id"},
	{event.ExtExpireAt, "after this time the event is not consumed"},
}
