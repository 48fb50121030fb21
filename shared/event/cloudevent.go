package event

import (
	"strconv"
	"time"
)

// CloudEvents extension attribute names. They are the Pub/Sub attribute names
// without underscores and are part of relaybus's stable contract.
const (
	ExtTopic              = "topic"
	ExtAggregateType      = "aggregatetype"
	ExtVersion            = "version"
	ExtSchemaVersion      = "schemaversion"
	ExtTraceID            = "traceid"
	ExtSpanID             = "spanid"
	ExtCausationID        = "causationid"
	ExtCorrelationID      = "correlationid"
	ExtSourceVersion      = "sourceversion"
	ExtInitiatorService   = "initiatorservice"
	ExtInitiatorOperation = "initiatoroperation"
	ExtInitiatorUserID    = "initiatoruserid"
	ExtInitiatorRequestID = "initiatorrequestid"
	ExtExpireAt           = "expireat"
	// ExtDeliverAt schedules an event sent to the publish function (RFC
	// 3339, see Event.DeliverAt). It is read on the way in and not
	// written on Pub/Sub: the outbox acts on it.
	ExtDeliverAt = "deliverat"
)

// SpecVersion is the CloudEvents version relaybus writes and reads.
const SpecVersion = "1.0"

// CloudEventAttributes returns the event's CloudEvents context attributes
// (specversion, id, type, source, subject, time, datacontenttype) and
// extension attributes (the Ext* names) as strings, keyed by attribute
// name: the mapping the package documentation tables, stated once. Empty
// optional fields are left out; times are RFC 3339 in UTC. A binary-mode
// writer prefixes each name with "ce-" (datacontenttype travels as the
// content type instead); a structured-mode writer adds data or
// data_base64.
func (e *Event) CloudEventAttributes() map[string]string {
	a := make(map[string]string, 20)
	set := func(name, value string) {
		if value != "" {
			a[name] = value
		}
	}
	a["specversion"] = SpecVersion
	a["id"] = e.ID
	a["type"] = e.Type
	a["source"] = e.Source
	set("subject", e.AggregateID)
	if !e.OccurredAt.IsZero() {
		a["time"] = e.OccurredAt.UTC().Format(time.RFC3339Nano)
	}
	set("datacontenttype", e.PayloadType)
	set(ExtTopic, e.Topic)
	set(ExtAggregateType, e.AggregateType)
	if e.Version != 0 {
		set(ExtVersion, strconv.FormatInt(e.Version, 10))
	}
	set(ExtSchemaVersion, e.SchemaVersion)
	set(ExtTraceID, e.TraceID)
	set(ExtSpanID, e.SpanID)
	set(ExtCausationID, e.ParentEventID)
	set(ExtCorrelationID, e.CorrelationID)
	set(ExtSourceVersion, e.SourceVersion)
	set(ExtInitiatorService, e.Initiator.Service)
	set(ExtInitiatorOperation, e.Initiator.Operation)
	set(ExtInitiatorUserID, e.Initiator.UserID)
	set(ExtInitiatorRequestID, e.Initiator.ClientRequestID)
	if !e.ExpireAt.IsZero() {
		set(ExtExpireAt, e.ExpireAt.UTC().Format(time.RFC3339Nano))
	}
	return a
}
