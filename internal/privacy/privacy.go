// Package privacy applies a topic's privacy rule (infra/topology.yaml,
// a topic's privacy block) to its payloads: which fields are personal,
// which field names the data subject, and, per place a payload is kept or
// shown (the ledger, the console, the dead-letter archive, the event
// history, log lines, span attributes), whether the payload is kept whole,
// redacted or not kept at all. It also runs an erasure by subject over a
// list of stores (Eraser).
//
// Redacting a JSON payload replaces each personal field by a keyed hash
// (HMAC-SHA256 under the deployment's privacy key, "hmac:" and 43 base64url
// characters), so two payloads with the same value still compare equal, or
// removes it (Rule.Redaction "remove"). A payload that is not JSON cannot
// be redacted field by field: a place set to redact keeps none of it.
//
// A topic that declares no rule keeps today's behaviour: every place keeps
// the payload whole.
package privacy

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
)

// Mode is what a place keeps of a payload.
type Mode string

// Modes.
const (
	// Whole keeps the payload as produced.
	Whole Mode = "whole"
	// Redact keeps the payload with its personal fields hashed or removed.
	Redact Mode = "redact"
	// Drop keeps nothing of the payload (its size and type only).
	Drop Mode = "drop"
)

// Place is where a payload is kept or shown.
type Place string

// Places.
const (
	// Ledger is the Firestore ledger's event documents.
	Ledger Place = "ledger"
	// Console is what the operations API and console answer.
	Console Place = "console"
	// Archive is the dead-letter archive (Firestore dead_letters).
	Archive Place = "archive"
	// History is the event history kept for backfills.
	History Place = "history"
	// Logs is log lines.
	Logs Place = "logs"
	// Traces is span attributes.
	Traces Place = "traces"
)

// Places lists every place, in the order the docs name them.
var Places = []Place{Ledger, Console, Archive, History, Logs, Traces}

// Redactions (Rule.Redaction).
const (
	// RedactHash replaces a personal field by its keyed hash (the default).
	RedactHash = "hash"
	// RedactRemove removes a personal field.
	RedactRemove = "remove"
)

// HashPrefix starts every hashed value.
const HashPrefix = "hmac:"

// Rule is a topic's privacy rule, as infra/topology.yaml declares it.
// The zero value declares nothing: every place keeps payloads whole.
type Rule struct {
	// Fields are the personal fields, as JSON pointers (RFC 6901, "/a/b";
	// a segment "*" means every element of an array or every member of an
	// object).
	Fields []string `yaml:"fields" json:"fields,omitempty"`
	// Subject is the JSON pointer of the field that names the data subject,
	// the id `relaybus erase --subject` is given. Empty: the topic's events
	// are not erased by subject.
	Subject string `yaml:"subject" json:"subject,omitempty"`
	// Redaction is how a redacted field is replaced: hash (the default) or
	// remove.
	Redaction string `yaml:"redaction" json:"redaction,omitempty"`
	// The mode of each place: whole, redact or drop. Left out: whole when
	// the rule declares no fields; when it declares fields, redact for the
	// ledger, console, logs and traces, whole for the archive and the
	// history (their payloads are delivered again by replays and
	// backfills).
	LedgerMode  Mode `yaml:"ledger" json:"ledger,omitempty"`
	ConsoleMode Mode `yaml:"console" json:"console,omitempty"`
	ArchiveMode Mode `yaml:"archive" json:"archive,omitempty"`
	HistoryMode Mode `yaml:"history" json:"history,omitempty"`
	LogsMode    Mode `yaml:"logs" json:"logs,omitempty"`
	TracesMode  Mode `yaml:"traces" json:"traces,omitempty"`
}

// Declared reports whether the rule says anything.
func (r Rule) Declared() bool {
	return len(r.Fields) > 0 || r.Subject != "" || r.Redaction != "" || r.LedgerMode != "" || r.ConsoleMode != "" ||
		r.ArchiveMode != "" || r.HistoryMode != "" || r.LogsMode != "" || r.TracesMode != ""
}

func (r Rule) declared(p Place) Mode {
	switch p {
	case Ledger:
		return r.LedgerMode
	case Console:
		return r.ConsoleMode
	case Archive:
		return r.ArchiveMode
	case History:
		return r.HistoryMode
	case Logs:
		return r.LogsMode
	case Traces:
		return r.TracesMode
	}
	return ""
}

// Mode returns the mode of a place, defaults applied.
func (r Rule) Mode(p Place) Mode {
	if m := r.declared(p); m != "" {
		return m
	}
	if len(r.Fields) == 0 {
		return Whole
	}
	switch p {
	case Archive, History:
		return Whole
	}
	return Redact
}

// Validate checks a rule; where names it in errors (a topic's
// "topics[0] (shop.order.events).privacy").
func (r Rule) Validate(where string) []error {
	var errs []error
	for i, f := range r.Fields {
		if _, err := parsePointer(f); err != nil {
			errs = append(errs, fmt.Errorf("%s.fields[%d]: %w", where, i, err))
		}
	}
	if r.Subject != "" {
		segs, err := parsePointer(r.Subject)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s.subject: %w", where, err))
		case len(segs) == 0 || strings.Contains(r.Subject, "*"):
			errs = append(errs, fmt.Errorf("%s.subject: must point at one field (no \"*\", not the whole payload), not %q", where, r.Subject))
		}
	}
	switch r.Redaction {
	case "", RedactHash, RedactRemove:
	default:
		errs = append(errs, fmt.Errorf("%s.redaction: must be hash or remove, not %q", where, r.Redaction))
	}
	for _, p := range Places {
		switch m := r.declared(p); m {
		case "", Whole, Drop:
		case Redact:
			if len(r.Fields) == 0 {
				errs = append(errs, fmt.Errorf("%s.%s: redact needs fields (the personal fields' JSON pointers)", where, p))
			}
		default:
			errs = append(errs, fmt.Errorf("%s.%s: must be whole, redact or drop, not %q", where, p, m))
		}
	}
	return errs
}

// parsePointer splits an RFC 6901 JSON pointer into unescaped segments.
func parsePointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if !strings.HasPrefix(p, "/") {
		return nil, fmt.Errorf("must be a JSON pointer starting with / (RFC 6901), not %q", p)
	}
	segs := strings.Split(p[1:], "/")
	for i, s := range segs {
		if strings.Contains(strings.ReplaceAll(strings.ReplaceAll(s, "~0", ""), "~1", ""), "~") {
			return nil, fmt.Errorf("must escape ~ as ~0 and / as ~1 (RFC 6901), not %q", p)
		}
		segs[i] = strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
	}
	return segs, nil
}

// Key is the privacy key hashes are made with. Keep it secret: with it,
// a guessed value's hash can be checked.
type Key struct{ b []byte }

// MinKeyBytes is the shortest key NewKey takes.
const MinKeyBytes = 16

// DevKey is the local stack's key, used when none is configured. It is
// public: hashes made with it hide nothing from whoever reads this.
const DevKey = "relaybus-local-privacy-key-not-a-secret"

// NewKey returns the key of a secret of at least MinKeyBytes bytes.
func NewKey(secret string) (Key, error) {
	if len(secret) < MinKeyBytes {
		return Key{}, fmt.Errorf("privacy key: must be at least %d bytes, not %d", MinKeyBytes, len(secret))
	}
	return Key{b: []byte(secret)}, nil
}

// IsZero reports whether the key was never set.
func (k Key) IsZero() bool { return len(k.b) == 0 }

func (k Key) mac(domain string, v []byte) string {
	h := hmac.New(sha256.New, k.b)
	h.Write([]byte(domain))
	h.Write([]byte{0})
	h.Write(v)
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// Hash returns the hash a personal field of value v (its JSON text, as
// compact JSON) is replaced by.
func (k Key) Hash(v []byte) string { return HashPrefix + k.mac("field", v) }

// HashValue returns the hash of a JSON string value s, the one Hash gives
// "s" in a payload: what an equality search for s looks for.
func (k Key) HashValue(s string) string {
	b, _ := json.Marshal(s)
	return k.Hash(b)
}

// SubjectKey is the stored form of a subject id: the stores record it, not
// the id, so erasure can find a subject's payloads without the stores
// holding the id in plain text.
func (k Key) SubjectKey(subject string) string { return k.mac("subject", []byte(subject)) }

// Result is a payload as a place keeps it.
type Result struct {
	// Payload is what to keep (nil when nothing is).
	Payload []byte
	// Redacted are the JSON pointers of the fields that were hashed or
	// removed (present in the payload), sorted.
	Redacted []string
	// Dropped is true when nothing of the payload is kept: the place's mode
	// is drop, or redact for a payload that is not JSON.
	Dropped bool
}

// ErrNoKey means a rule redacts by hash and no key was given.
var ErrNoKey = errors.New("privacy: no key to hash personal fields with")

// Apply returns payload as place keeps it under the rule.
func (r Rule) Apply(p Place, payload []byte, k Key) (Result, error) {
	switch r.Mode(p) {
	case Drop:
		return Result{Dropped: true}, nil
	case Redact:
	default:
		return Result{Payload: payload}, nil
	}
	if len(payload) == 0 {
		return Result{Payload: payload}, nil
	}
	hash := r.Redaction != RedactRemove
	if hash && k.IsZero() {
		return Result{}, ErrNoKey
	}
	if !json.Valid(payload) { // not JSON: no field can be picked out
		return Result{Dropped: true}, nil
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return Result{}, fmt.Errorf("privacy: decode payload: %w", err)
	}
	seen := map[string]bool{}
	for _, f := range r.Fields {
		segs, err := parsePointer(f)
		if err != nil {
			return Result{}, fmt.Errorf("privacy: field %q: %w", f, err)
		}
		if len(segs) == 0 { // the whole payload is personal
			return Result{Dropped: true}, nil
		}
		doc = redactAt(doc, segs, "", func(path string, v any) (any, bool) {
			seen[path] = true
			if !hash {
				return nil, false
			}
			b, _ := json.Marshal(v)
			return k.Hash(b), true
		})
	}
	if len(seen) == 0 {
		return Result{Payload: payload}, nil
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return Result{}, fmt.Errorf("privacy: encode redacted payload: %w", err)
	}
	red := make([]string, 0, len(seen))
	for p := range seen {
		red = append(red, p)
	}
	sort.Strings(red)
	return Result{Payload: out, Redacted: red}, nil
}

// redactAt walks segs from v (at pointer path) and replaces what it finds
// by f's answer (removes it when f says false). It returns v, changed.
func redactAt(v any, segs []string, path string, f func(path string, v any) (any, bool)) any {
	seg, rest := segs[0], segs[1:]
	apply := func(child any, childPath string) (any, bool) {
		if len(rest) == 0 {
			return f(childPath, child)
		}
		return redactAt(child, rest, childPath, f), true
	}
	switch x := v.(type) {
	case map[string]any:
		keys := []string{seg}
		if seg == "*" {
			keys = keys[:0]
			for key := range x {
				keys = append(keys, key)
			}
		}
		for _, key := range keys {
			child, ok := x[key]
			if !ok {
				continue
			}
			nv, keep := apply(child, path+"/"+escape(key))
			if keep {
				x[key] = nv
			} else {
				delete(x, key)
			}
		}
	case []any:
		var idx []int
		if seg == "*" {
			for i := range x {
				idx = append(idx, i)
			}
		} else if i, err := strconv.Atoi(seg); err == nil && i >= 0 && i < len(x) && strconv.Itoa(i) == seg {
			idx = []int{i}
		}
		removed := map[int]bool{}
		for _, i := range idx {
			nv, keep := apply(x[i], path+"/"+strconv.Itoa(i))
			if keep {
				x[i] = nv
			} else {
				removed[i] = true
			}
		}
		if len(removed) > 0 { // a removed element leaves null: indexes stay
			for i := range removed {
				x[i] = nil
			}
		}
	}
	return v
}

func escape(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1") }

// SubjectOf returns the subject id a JSON payload names at the rule's
// Subject pointer (a string, or a number as written), and whether it names
// one.
func (r Rule) SubjectOf(payload []byte) (string, bool) {
	segs, err := parsePointer(r.Subject)
	if err != nil || len(segs) == 0 {
		return "", false
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", false
	}
	for _, s := range segs {
		switch x := v.(type) {
		case map[string]any:
			v = x[s]
		case []any:
			i, err := strconv.Atoi(s)
			if err != nil || i < 0 || i >= len(x) {
				return "", false
			}
			v = x[i]
		default:
			return "", false
		}
	}
	switch x := v.(type) {
	case string:
		return x, x != ""
	case json.Number:
		return x.String(), true
	}
	return "", false
}

// SubjectPath returns the rule's Subject pointer as the segments of a
// Postgres text[] path (for #>>), and whether it has one.
func (r Rule) SubjectPath() ([]string, bool) {
	segs, err := parsePointer(r.Subject)
	return segs, err == nil && len(segs) > 0
}

// Rules are the privacy rules of every topic, by topic name; a topic it
// does not name declares nothing.
type Rules map[string]Rule

// Of returns a topic's rule.
func (rs Rules) Of(topic string) Rule { return rs[topic] }

// Subjects returns the topics whose rule names a subject, sorted.
func (rs Rules) Subjects() []string {
	var out []string
	for t, r := range rs {
		if r.Subject != "" {
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out
}

// ConfiguredKey returns the key of the PRIVACY_KEY setting, secret. Left
// empty it is DevKey, the local stack's public key, and log is told when
// some rule would hash with it (a deployment must set PRIVACY_KEY).
func ConfiguredKey(secret string, rules Rules, log *slog.Logger) (Key, error) {
	if secret == "" {
		if len(rules) > 0 && log != nil {
			log.Warn("privacy: PRIVACY_KEY is not set: personal fields and subject ids are hashed with the public development key (set PRIVACY_KEY from Secret Manager in a deployment; docs/privacy.md)")
		}
		return NewKey(DevKey)
	}
	k, err := NewKey(secret)
	if err != nil {
		return Key{}, fmt.Errorf("PRIVACY_KEY: %w", err)
	}
	return k, nil
}
