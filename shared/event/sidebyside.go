package event

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Encoded is one schema version's payload of a change published side by
// side (see SideBySide).
type Encoded struct {
	// SchemaVersion is the payload's schema version (v1, v2, ...).
	SchemaVersion string
	// PayloadType is its media type (DefaultPayloadType when empty).
	PayloadType string
	// Payload is the change in that schema version.
	Payload []byte
}

// SideBySide returns the events of one business change published in
// several schema versions at once, relaybus's upgrade path for a breaking
// change: the producer publishes v1 and v2 side by side until every
// consumer reads v2 (docs/consuming.md "Two schema versions side by side"). Enqueue them together, in the order
// returned, in one transaction (outbox.Enqueue).
//
// change holds what the versions share: type, topic, aggregate, source,
// initiator, trace, and Version, the aggregate version of the first
// event. Its ID is the change's id (generated when empty); OccurredAt,
// TraceID and SpanID are filled when empty, so every version carries the
// same. The events come newest schema version first, on consecutive
// aggregate versions (change.Version, +1, ...; the aggregate's next change
// takes the version after the last), each with the id
// <change id>.<schema version> (ChangeOf reads it back).
//
// A consumer's Mux applies one version per change: the newest it reads
// (registered for the event's type), which comes first; the older ones
// are acknowledged without effect. A version newer than every one it
// reads is acknowledged without effect too, since an older one follows.
// So a consumer that reads v1, v2 or both sees the change once, in
// aggregate order, and the ledger records every version consumed.
func SideBySide(change *Event, versions ...Encoded) ([]*Event, error) {
	if len(versions) == 0 {
		return nil, &FieldError{Field: "schemaVersion", Rule: "a side-by-side change needs at least one schema version"}
	}
	vs := slices.Clone(versions)
	seen := map[string]bool{}
	for _, v := range vs {
		if !validSchemaVersion(v.SchemaVersion) {
			return nil, &FieldError{Field: "schemaVersion", Rule: ruleSchemaVersion + fmt.Sprintf(" (got %q)", v.SchemaVersion)}
		}
		if seen[v.SchemaVersion] {
			return nil, &FieldError{Field: "schemaVersion", Rule: "each schema version at most once per change (" + v.SchemaVersion + " twice)"}
		}
		seen[v.SchemaVersion] = true
	}
	// Newest first: a consumer applies the first version it reads.
	slices.SortFunc(vs, func(a, b Encoded) int { return schemaNumber(b.SchemaVersion) - schemaNumber(a.SchemaVersion) })
	id := change.ID
	if id == "" {
		id = NewID()
	}
	if len(id)+1+len(vs[0].SchemaVersion) > 128 {
		return nil, &FieldError{Field: "eventId", Rule: "a side-by-side change's id leaves room for .<schema version> within 128 characters"}
	}
	if change.OccurredAt.IsZero() {
		change.OccurredAt = time.Now().UTC()
	}
	if change.TraceID == "" {
		change.TraceID = NewTraceID()
	}
	if change.SpanID == "" {
		change.SpanID = NewSpanID()
	}
	out := make([]*Event, len(vs))
	for i, v := range vs {
		e := *change
		e.ID = id + "." + v.SchemaVersion
		e.Version = change.Version + int64(i)
		e.SchemaVersion, e.PayloadType, e.Payload = v.SchemaVersion, v.PayloadType, v.Payload
		out[i] = &e
	}
	return out, nil
}

// ChangeOf returns the change id of an event SideBySide made (its id
// without the .<schema version> suffix) and true, or "" and false for an
// event published in one version.
func ChangeOf(e *Event) (string, bool) {
	stem, ok := strings.CutSuffix(e.ID, "."+e.SchemaVersion)
	if !ok || stem == "" || e.SchemaVersion == "" {
		return "", false
	}
	return stem, true
}

// SchemaNumber returns the number of a schema version (2 for "v2"), or 0
// when it is not of the form v<number>.
func SchemaNumber(v string) int { return schemaNumber(v) }

func schemaNumber(v string) int {
	if !validSchemaVersion(v) {
		return 0
	}
	n, err := strconv.Atoi(v[1:])
	if err != nil {
		return 0
	}
	return n
}
