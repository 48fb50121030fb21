package client

import (
	"fmt"
	"strconv"
	"strings"
)

// APIError is an answer of publish that is not a success: its HTTP status,
// publish's error code (invalid_event, unavailable, busy, ...) and
// message. The more specific errors below embed it; a retryable answer
// (503, 429, 5xx) that was still failing after the last attempt is
// returned as an *APIError.
type APIError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Code is publish's error code, or "http_<status>" when the answer
	// was not publish's own (a proxy's).
	Code string
	// Message is publish's message.
	Message string
	// Attempts is how many requests were made.
	Attempts int
}

// Error returns the status, the error code and publish's reason.
func (e *APIError) Error() string {
	s := "relaybus publish: " + strconv.Itoa(e.StatusCode) + " " + e.Code
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Attempts > 1 {
		s += " (after " + strconv.Itoa(e.Attempts) + " attempts)"
	}
	return s
}

// FieldProblem is one field of one event that broke one rule.
type FieldProblem struct {
	// Index is the event's position in a batch (nil for a single event).
	Index *int `json:"index,omitempty"`
	// EventID is the event's id.
	EventID string `json:"eventId,omitempty"`
	// Field is the field's name in the envelope's spelling (aggregateId,
	// initiator.userId, ...).
	Field string `json:"field"`
	// Rule is what the field must be.
	Rule string `json:"rule"`
}

// String returns the field and the rule it broke.
func (p FieldProblem) String() string {
	s := p.Field + ": " + p.Rule
	if p.Index != nil {
		s = "events[" + strconv.Itoa(*p.Index) + "]." + s
	}
	return s
}

// InvalidError is a request publish refused for what it holds (400, or
// 413 for a size limit): nothing was written. Fields name each field that
// broke a rule (empty when the body as a whole was malformed).
type InvalidError struct {
	APIError
	Fields []FieldProblem
}

// Field returns the first problem of the named field, if any.
func (e *InvalidError) Field(name string) (FieldProblem, bool) {
	for _, p := range e.Fields {
		if p.Field == name {
			return p, true
		}
	}
	return FieldProblem{}, false
}

// Unwrap returns the answer as an *APIError.
func (e *InvalidError) Unwrap() error { return &e.APIError }

// AuthError is a caller publish did not admit: 401 (no verified identity)
// or 403 (the topology does not list the caller among the topic's
// publishers). Nothing was written.
type AuthError struct {
	APIError
	// Topic and Caller name, in a 403, the topic and the caller refused.
	Topic, Caller string
}

// Unwrap returns the answer as an *APIError.
func (e *AuthError) Unwrap() error { return &e.APIError }

// ConflictError is a conflict (409), nothing written: Code
// version_conflict (the aggregate already has that version under another
// event id) or event_id_conflict (another event already has that event id:
// a repeated id must repeat the same event, so a new event needs a new id).
type ConflictError struct {
	APIError
	Fields []FieldProblem
}

// Unwrap returns the answer as an *APIError.
func (e *ConflictError) Unwrap() error { return &e.APIError }

// SkippedError says that events were not written because their topic has
// no enabled consumer (an event nobody would consume is not sent): publish logged it at
// ERROR and did not fail the request. It comes with the results; a caller
// that does not care ignores it.
type SkippedError struct {
	Skipped []Result
}

// Error says how many events were skipped and names their topics.
func (e *SkippedError) Error() string {
	var topics []string
	seen := map[string]bool{}
	for _, r := range e.Skipped {
		if !seen[r.Topic] {
			seen[r.Topic] = true
			topics = append(topics, r.Topic)
		}
	}
	return fmt.Sprintf("relaybus publish: %d event(s) SKIPPED, nothing written: no enabled consumer on topic %s",
		len(e.Skipped), strings.Join(topics, ", "))
}

// NetworkError is a request that got no answer after the last attempt:
// the events may or may not have been written; publishing them again with
// the same ids is safe.
type NetworkError struct {
	Attempts int
	Err      error
}

// Error says the request got no answer, and why.
func (e *NetworkError) Error() string {
	return fmt.Sprintf("relaybus publish: no answer after %d attempt(s): %v", e.Attempts, e.Err)
}

// Unwrap returns the transport's error.
func (e *NetworkError) Unwrap() error { return e.Err }
