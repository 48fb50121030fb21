package privacy

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Erasure is one erasure by subject, as each store's step is given it.
type Erasure struct {
	// Subject is the subject id, as the payloads carry it.
	Subject string
	// SubjectKey is Key.SubjectKey(Subject): how the stores that record
	// the subject (the ledger) know it.
	SubjectKey string
	// Rules are the topics' rules; only topics whose rule names a subject
	// (Rules.Subjects) hold payloads erasure can find.
	Rules Rules
	// By is who erases (the audit entry's caller), for tombstones.
	By string
}

// Step is one store's part of an erasure. Erase makes every payload of the
// subject in the store unreadable and returns how many records it changed;
// it is idempotent, so a failed erasure is run again whole.
type Step struct {
	// Name names the store in the report: "outbox:main", "ledger",
	// "archive", "history".
	Name  string
	Erase func(ctx context.Context, e Erasure) (int, error)
}

// StepResult is one step's outcome.
type StepResult struct {
	Store  string `json:"store"`
	Erased int    `json:"erased"`
	Error  string `json:"error,omitempty"`
}

// Report is an erasure's outcome, store by store.
type Report struct {
	// Topics are the topics searched (those whose rule names a subject).
	Topics []string     `json:"topics"`
	Stores []StepResult `json:"stores"`
	// Complete is true when every step succeeded.
	Complete bool `json:"complete"`
}

// ErrNoSubject means an erasure was asked for an empty subject id.
var ErrNoSubject = errors.New("privacy: erase: subject: must not be empty")

// MaxSubjectBytes bounds a subject id.
const MaxSubjectBytes = 512

// Erase runs every step for subject, all of them whatever fails (each is
// idempotent), and returns the report and the steps' errors joined.
func Erase(ctx context.Context, steps []Step, e Erasure) (Report, error) {
	if strings.TrimSpace(e.Subject) == "" {
		return Report{}, ErrNoSubject
	}
	if len(e.Subject) > MaxSubjectBytes {
		return Report{}, fmt.Errorf("privacy: erase: subject: must be at most %d bytes, not %d", MaxSubjectBytes, len(e.Subject))
	}
	rep := Report{Topics: e.Rules.Subjects(), Complete: true}
	if rep.Topics == nil {
		rep.Topics = []string{}
	}
	var errs []error
	for _, s := range steps {
		n, err := s.Erase(ctx, e)
		r := StepResult{Store: s.Name, Erased: n}
		if err != nil {
			r.Error = err.Error()
			rep.Complete = false
			errs = append(errs, fmt.Errorf("privacy: erase from %s: %w", s.Name, err))
		}
		rep.Stores = append(rep.Stores, r)
	}
	return rep, errors.Join(errs...)
}
