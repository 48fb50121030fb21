package event

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
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
	ExtInitiatorService   = "initiatorservice"
	ExtInitiatorOperation = "initiatoroperation"
	ExtInitiatorUserID    = "initiatoruserid"
	ExtInitiatorRequestID = "initiatorrequestid"
	ExtExpireAt           = "expireat"
)

// CloudEvent returns the event as a CloudEvents 1.0 event. Empty optional
// fields are left out. The payload is carried as-is: inline JSON for JSON
// payload types, base64 otherwise.
func (e *Event) CloudEvent() cloudevents.Event {
	ce := cloudevents.New(cloudevents.CloudEventsVersionV1)
	ce.SetID(e.ID)
	ce.SetType(e.Type)
	ce.SetSource(e.Source)
	if e.AggregateID != "" {
		ce.SetSubject(e.AggregateID)
	}
	if !e.OccurredAt.IsZero() {
		ce.SetTime(e.OccurredAt)
	}
	if e.PayloadType != "" {
		ce.SetDataContentType(e.PayloadType)
	}
	if e.Payload != nil {
		ce.DataEncoded = e.Payload
		ce.DataBase64 = !IsJSONType(e.PayloadType)
	}
	set := func(name, value string) {
		if value != "" {
			ce.SetExtension(name, value)
		}
	}
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
	set(ExtInitiatorService, e.Initiator.Service)
	set(ExtInitiatorOperation, e.Initiator.Operation)
	set(ExtInitiatorUserID, e.Initiator.UserID)
	set(ExtInitiatorRequestID, e.Initiator.ClientRequestID)
	if !e.ExpireAt.IsZero() {
		set(ExtExpireAt, e.ExpireAt.UTC().Format(time.RFC3339Nano))
	}
	return ce
}

// FromCloudEvent reads an event out of a CloudEvent. It reports unparsable
// attributes (a version that is not an integer, an expireat that is not a
// timestamp) as field errors but does not otherwise validate: call Normalize
// and Validate, or Prepare, on the result.
func FromCloudEvent(ce cloudevents.Event) (Event, error) {
	e := Event{
		ID:          ce.ID(),
		Type:        ce.Type(),
		Source:      ce.Source(),
		AggregateID: ce.Subject(),
		OccurredAt:  ce.Time(),
		PayloadType: ce.DataContentType(),
		Payload:     ce.Data(),
	}
	ext := ce.Extensions()
	str := func(name string) string {
		v, ok := ext[name]
		if !ok {
			return ""
		}
		s, err := types.ToString(v)
		if err != nil {
			return fmt.Sprint(v)
		}
		return s
	}
	var errs []error
	e.Topic = str(ExtTopic)
	e.AggregateType = str(ExtAggregateType)
	if v := str(ExtVersion); v != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			errs = append(errs, fieldErr("version", ruleVersion))
		}
		e.Version = n
	}
	e.SchemaVersion = str(ExtSchemaVersion)
	e.TraceID = str(ExtTraceID)
	e.SpanID = str(ExtSpanID)
	e.ParentEventID = str(ExtCausationID)
	e.CorrelationID = str(ExtCorrelationID)
	e.Initiator = Initiator{
		Service:         str(ExtInitiatorService),
		Operation:       str(ExtInitiatorOperation),
		UserID:          str(ExtInitiatorUserID),
		ClientRequestID: str(ExtInitiatorRequestID),
	}
	if v, ok := ext[ExtExpireAt]; ok {
		t, err := types.ToTime(v)
		if err != nil {
			errs = append(errs, fieldErr("expireAt", "must be an RFC 3339 timestamp"))
		}
		e.ExpireAt = t
	}
	return e, errors.Join(errs...)
}
