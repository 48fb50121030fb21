package event

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrInvalid is matched (with [errors.Is]) by every [*FieldError].
var ErrInvalid = errors.New("invalid event")

// ErrTooLarge is matched by the [*FieldError] that reports a payload or an
// encoded message over its size limit. HTTP entry points answer it with 413.
var ErrTooLarge = errors.New("event too large")

// FieldError reports one field that broke one rule.
type FieldError struct {
	// Field is the field's name as the JSON envelope spells it, for example
	// "aggregateId" or "initiator.userId".
	Field string
	// Rule says what the field must be, for example "required" or
	// "at most 256 characters of [A-Za-z0-9:_-]".
	Rule string
	// tooLarge marks size-limit violations so that errors.Is(err, ErrTooLarge) holds.
	tooLarge bool
}

// Error returns "field: rule".
func (e *FieldError) Error() string { return e.Field + ": " + e.Rule }

// Is reports whether target is ErrInvalid, or ErrTooLarge for size violations.
func (e *FieldError) Is(target error) bool {
	return target == ErrInvalid || (e.tooLarge && target == ErrTooLarge)
}

// TooLarge returns a *FieldError for field that matches ErrTooLarge as
// well as ErrInvalid: a size limit broken (the encoders report an encoded
// message over Pub/Sub's limit with it).
func TooLarge(field, rule string) *FieldError {
	return &FieldError{Field: field, Rule: rule, tooLarge: true}
}

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Rule: fmt.Sprintf(format, args...)}
}

// FieldErrors returns every *FieldError wrapped in err, in order. It returns
// nil when err holds none.
func FieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if fe, ok := e.(*FieldError); ok { //nolint:errorlint // the walk unwraps by itself, to collect every FieldError (errors.As finds the first)
			out = append(out, fe)
			return
		}
		switch u := e.(type) { //nolint:errorlint // see above
		case interface{ Unwrap() []error }:
			for _, inner := range u.Unwrap() {
				walk(inner)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// DecodeError reports a message that cannot become an event. Reason is a
// stable, machine-readable code (one of the Reason* constants) that consumers
// put on dead letters; Err says what exactly was wrong.
type DecodeError struct {
	Reason string
	Err    error
}

// Reasons a message cannot be decoded. They travel as the dead-letter reason.
const (
	// ReasonMalformed: the data is not a CloudEvent in the format the message
	// claims, or a required attribute is missing or unparsable.
	ReasonMalformed = "malformed"
	// ReasonMissingAggregateID: no aggregate id in the envelope, the
	// attributes or the ordering key.
	ReasonMissingAggregateID = "missing_aggregate_id"
	// ReasonInvalidAggregateID: an aggregate id was found but breaks the rule.
	ReasonInvalidAggregateID = "invalid_aggregate_id"
	// ReasonInvalid: the event decoded but a field breaks its rule.
	ReasonInvalid = "invalid_event"
	// ReasonTooLarge: the payload is over the configured limit.
	ReasonTooLarge = "too_large"
)

// Error returns "reason: err".
func (e *DecodeError) Error() string { return e.Reason + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *DecodeError) Unwrap() error { return e.Err }

// ParseVersion reads an aggregate version written as a decimal integer
// (a CloudEvents version extension, the envelope's quoted form); what is
// not one is a *FieldError naming version and its rule. It neither trims
// nor checks the range: Validate does.
func ParseVersion(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return n, fieldErr("version", ruleVersion)
	}
	return n, nil
}
