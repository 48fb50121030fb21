package dlqreplay

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/event"
)

// Rules the API checks its parameters against, quoted in its 400 answers.
const (
	ruleEventID     = "1 to 128 characters of [A-Za-z0-9._:-]"
	ruleLetterID    = "1 to 256 characters of [A-Za-z0-9._:~-]"
	ruleToken       = "at most 128 characters of [A-Za-z0-9._:-]"
	ruleEventType   = "1 to 128 characters, dot-separated words of [A-Za-z0-9_-] (e.g. order.purchased)"
	ruleAggregateID = "1 to 256 characters of [A-Za-z0-9:_-]"
	ruleService     = "1 to 256 printable characters without spaces"
	ruleReason      = "1 to 64 characters of [a-z0-9_]"
	rulePageToken   = "a nextPageToken from the previous page: at most 1024 characters of [A-Za-z0-9._:~=-]"
	ruleTime        = "an RFC 3339 time between 2000-01-01 and 2100-01-01 (e.g. 2026-11-22T09:00:00Z)"
	ruleBool        = "true or false"
	ruleStatus      = "one of PENDING, SENT, CONSUMED, PARTIAL, FAILED, RETRYING, EXPIRED"
	ruleWindow      = "a duration from 1m to 720h (e.g. 1h, 24h)"
	ruleSnapshot    = "3 to 255 characters of [A-Za-z0-9-_.~+%], starting with a letter and not with goog"
)

// maxBody bounds a JSON request body (the archive's deliveries have their
// own, larger limit).
const maxBody = 64 << 10

var (
	minTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
)

// invalid answers 400 with every broken field and its rule.
type invalid struct {
	fields []*event.FieldError
}

func (v *invalid) add(field, rule string, a ...any) {
	v.fields = append(v.fields, &event.FieldError{Field: field, Rule: fmt.Sprintf(rule, a...)})
}

func (v *invalid) err() error {
	if len(v.fields) == 0 {
		return nil
	}
	return badRequest(v.fields)
}

// badRequest is the 400 answer naming each field with its rule.
func badRequest(fields []*event.FieldError) *apiError {
	msgs := make([]string, len(fields))
	out := make([]fieldRule, len(fields))
	for i, f := range fields {
		msgs[i] = f.Field + ": " + f.Rule
		out[i] = fieldRule{Field: f.Field, Rule: f.Rule}
	}
	e := fail(http.StatusBadRequest, "invalid_argument", "%s", strings.Join(msgs, "; "))
	e.Fields = out
	return e
}

type fieldRule struct {
	Field string `json:"field"`
	Rule  string `json:"rule"`
}

// query reads and validates a request's query parameters: only the
// allowed names, each at most once.
type query struct {
	v   url.Values
	bad invalid
}

func newQuery(r *http.Request, allowed ...string) *query {
	q := &query{}
	v, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		q.bad.add("query", "a valid URL query string")
		q.v = url.Values{}
		return q
	}
	q.v = v
	ok := map[string]bool{}
	for _, a := range allowed {
		ok[a] = true
	}
	var keys []string
	for k := range v {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		switch {
		case !ok[k]:
			name := k
			if len(name) > 64 {
				name = name[:64] + "…"
			}
			if len(allowed) == 0 {
				q.bad.add(name, "unknown parameter: this route takes none")
			} else {
				q.bad.add(name, "unknown parameter; this route takes %s", strings.Join(allowed, ", "))
			}
		case len(v[k]) > 1:
			q.bad.add(k, "given %d times; give it once", len(v[k]))
		}
	}
	return q
}

// str returns a parameter checked by valid ("" when absent).
func (q *query) str(name string, valid func(string) bool, rule string) string {
	s := q.v.Get(name)
	if s != "" && !valid(s) {
		q.bad.add(name, "%s", rule)
		return ""
	}
	return s
}

func (q *query) topic(name string) string {
	return q.str(name, func(s string) bool { return names.ValidateTopic(s) == nil && !names.IsDeadLetter(s) }, names.TopicRule)
}

func (q *query) consumer(name string) string {
	return q.str(name, func(s string) bool { return names.ValidateConsumer(s) == nil }, names.ConsumerRule)
}

func (q *query) integer(name string, lo, hi int) int {
	s := q.v.Get(name)
	if s == "" {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		q.bad.add(name, "an integer from %d to %d", lo, hi)
		return 0
	}
	return n
}

func (q *query) time(name string) time.Time {
	s := q.v.Get(name)
	if s == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil || t.Before(minTime) || !t.Before(maxTime) || len(s) > 40 {
		q.bad.add(name, "%s", ruleTime)
		return time.Time{}
	}
	return t.UTC()
}

func (q *query) boolean(name string) bool {
	switch q.v.Get(name) {
	case "", "false":
		return false
	case "true":
		return true
	}
	q.bad.add(name, "%s", ruleBool)
	return false
}

func (q *query) status(name string) model.Status {
	s := q.v.Get(name)
	if s == "" {
		return ""
	}
	st, err := model.ParseStatus(s)
	if err != nil || len(s) > 16 {
		q.bad.add(name, "%s", ruleStatus)
		return ""
	}
	return st
}

func (q *query) duration(name string, def time.Duration) time.Duration {
	s := q.v.Get(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Minute || d > 720*time.Hour {
		q.bad.add(name, "%s", ruleWindow)
		return def
	}
	return d
}

func (q *query) err() error { return q.bad.err() }

// The character rules.

func charset(s string, max int, extra string) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(extra, c) >= 0) {
			return false
		}
	}
	return true
}

func validEventID(s string) bool  { return s != "." && s != ".." && charset(s, 128, "._:-") }
func validLetterID(s string) bool { return s != "." && s != ".." && charset(s, 256, "._:~-") }
func validTrace(s string) bool    { return charset(s, 128, "._:-") }
func validAggregate(s string) bool {
	return charset(s, 256, ":_-")
}
func validPageToken(s string) bool { return charset(s, 1024, "._:~=-") }

func validEventType(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for _, w := range strings.Split(s, ".") {
		if !charset(w, 128, "_-") {
			return false
		}
	}
	return true
}

func validService(s string) bool {
	if len(s) == 0 || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

func validReason(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func validSnapshot(s string) bool {
	return len(s) >= 3 && charset(s, 255, "-_.~+%") && (s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z') &&
		!strings.HasPrefix(strings.ToLower(s), "goog")
}

// decodeBody reads a JSON object into v: at most maxBody bytes, no unknown
// fields, nothing after it. An empty body leaves v as it is when optional.
func decodeBody(r *http.Request, v any, optional bool) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return fail(http.StatusBadRequest, "invalid_argument", "body: could not be read")
	}
	if len(b) > maxBody {
		return fail(http.StatusRequestEntityTooLarge, "too_large", "body: at most %d bytes", maxBody)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		if optional {
			return nil
		}
		return badRequest([]*event.FieldError{{Field: "body", Rule: "a JSON object is required"}})
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &te) && te.Field != "":
			return badRequest([]*event.FieldError{{Field: te.Field, Rule: "must be a JSON " + jsonKind(te.Type.Kind().String())}})
		case errors.As(err, &se), errors.Is(err, io.ErrUnexpectedEOF):
			return badRequest([]*event.FieldError{{Field: "body", Rule: "must be a JSON object"}})
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			if len(f) > 64 {
				f = f[:64] + "…"
			}
			return badRequest([]*event.FieldError{{Field: f, Rule: "unknown field"}})
		}
		return badRequest([]*event.FieldError{{Field: "body", Rule: "must be a JSON object"}})
	}
	if dec.More() {
		return badRequest([]*event.FieldError{{Field: "body", Rule: "one JSON object, nothing after it"}})
	}
	return nil
}

func jsonKind(goKind string) string {
	switch goKind {
	case "bool":
		return "boolean"
	case "string":
		return "string"
	case "int", "int64", "int32", "float64":
		return "number"
	}
	return "value of the right type"
}
