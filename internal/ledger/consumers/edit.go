package consumers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ledger/internal/fsdoc"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/event"
)

// ConsumerEntry is one topic_consumers document as operators see it
// (docs/ledger.md "Collections").
type ConsumerEntry struct {
	Topic       string    `firestore:"topic" json:"topic"`
	ConsumerID  string    `firestore:"consumerId" json:"consumerId"`
	Enabled     bool      `firestore:"enabled" json:"enabled"`
	SortOrder   int       `firestore:"sortOrder" json:"sortOrder"`
	Description string    `firestore:"description" json:"description"`
	CreatedAt   time.Time `firestore:"createdAt" json:"createdAt"`
	UpdatedAt   time.Time `firestore:"updatedAt" json:"updatedAt"`
	// UpdatedBy is the operator who last changed the entry through
	// ChangeConsumer (empty when the deploy's sync wrote it).
	UpdatedBy string `firestore:"updatedBy,omitempty" json:"updatedBy,omitempty"`
}

// Consumers returns every topic_consumers entry, enabled or not, by topic,
// then sort order, then consumer id.
func (s *Registry) Consumers(ctx context.Context) ([]ConsumerEntry, error) {
	docs, err := fsdoc.Query(ctx, nil, fsdoc.ShapeAllConsumers.Query(s.consumers.Query, nil))
	if err != nil {
		return nil, fmt.Errorf("ledger: consumers: %w", err)
	}
	out := make([]ConsumerEntry, 0, len(docs))
	for _, d := range docs {
		var c ConsumerEntry
		if err := d.DataTo(&c); err != nil {
			return nil, fmt.Errorf("ledger: decode %s/%s: %w", model.CollectionConsumers, d.Ref.ID, err)
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		if a.SortOrder != b.SortOrder {
			return a.SortOrder < b.SortOrder
		}
		return a.ConsumerID < b.ConsumerID
	})
	return out, nil
}

// ConsumerChange is an operator's change to one topic_consumers entry.
// Nil fields are left as they are.
type ConsumerChange struct {
	Topic      string
	ConsumerID string
	// Add creates the entry (enabled unless Enabled says otherwise); the
	// entry must not exist. Without Add the entry must exist.
	Add         bool
	Enabled     *bool
	Description *string
	SortOrder   *int
	// KeepOneEnabled refuses (ErrLastConsumer) a change that would leave
	// the topic without an enabled consumer: its new events would then be
	// SKIPPED, written nowhere. Without it such a change is made and its
	// audit entry says so.
	KeepOneEnabled bool
	// Audit holds what the change's audit entry carries besides the
	// change: Method, RequestID and Ref (the entry that started the
	// action). Its Outcome is audit.OutcomeSucceeded.
	Audit audit.Entry
}

// Registry edit errors.
var (
	// ErrConsumerExists: Add found the entry there.
	ErrConsumerExists = errors.New("the topic already has this consumer")
	// ErrConsumerNotFound: a change named an entry that does not exist.
	ErrConsumerNotFound = errors.New("the topic has no such consumer")
	// ErrLastConsumer: KeepOneEnabled refused to disable the topic's last
	// enabled consumer.
	ErrLastConsumer = errors.New("it is the topic's last enabled consumer")
)

// NoConsumerLeft is what an audit entry's Detail says when a change left a
// topic without an enabled consumer.
const NoConsumerLeft = "no enabled consumer left on the topic: its new events are SKIPPED (publish answers 200 SKIPPED, Go producers and handlers' Emit skip them; nothing is written or delivered) until a consumer is enabled again"

// MaxSortOrder bounds a consumer's sort order.
const MaxSortOrder = 10000

// validate checks a change, naming each broken field.
// Validate checks the change's fields against their rules (ChangeConsumer
// does too, before anything is read or written).
func (c ConsumerChange) Validate() error { return c.validate() }

func (c ConsumerChange) validate() error {
	var errs []error
	if err := names.ValidateTopic(c.Topic); err != nil || names.IsDeadLetter(c.Topic) {
		errs = append(errs, &event.FieldError{Field: "topic", Rule: names.TopicRule})
	}
	if err := names.ValidateConsumer(c.ConsumerID); err != nil {
		errs = append(errs, &event.FieldError{Field: "consumerId", Rule: names.ConsumerRule})
	}
	if c.Description != nil && !printable(*c.Description, 256) {
		errs = append(errs, &event.FieldError{Field: "description", Rule: "at most 256 printable characters"})
	}
	if c.SortOrder != nil && (*c.SortOrder < 0 || *c.SortOrder > MaxSortOrder) {
		errs = append(errs, &event.FieldError{Field: "sortOrder", Rule: "an integer from 0 to " + strconv.Itoa(MaxSortOrder)})
	}
	if !c.Add && c.Enabled == nil && c.Description == nil && c.SortOrder == nil {
		errs = append(errs, &event.FieldError{Field: "enabled", Rule: "give at least one of enabled, description, sortOrder"})
	}
	return errors.Join(errs...)
}

func printable(s string, max int) bool {
	if len(s) > max {
		return false
	}
	for _, r := range s {
		if r < ' ' || r == 0x7f || r == 0xfffd {
			return false
		}
	}
	return true
}

// ChangeConsumer adds, enables, disables or describes one topic_consumers
// entry and returns the audit entry saying who changed what (outcome
// succeeded, with ch.Audit's method, request and reference): written in
// the change's transaction when the audit log shares the registry's
// database, else returned unwritten (ID empty) for the caller to append
// once the change has committed. The change applies to events sent afterwards (each event
// keeps the expected consumers it was sent with), once the services'
// registry caches expire (registry.DefaultCacheTTL). A change that changes
// nothing writes nothing and returns a nil audit entry.
//
// The deploy's sync (SyncConsumers, from infra/topology.yaml) makes the
// registry match the topology again: a change meant to last belongs in the
// topology.
func (s *Registry) ChangeConsumer(ctx context.Context, ch ConsumerChange, by string) (ConsumerEntry, *audit.Entry, error) {
	if err := ch.validate(); err != nil {
		return ConsumerEntry{}, nil, fmt.Errorf("ledger: change consumer: %w", err)
	}
	ref := s.consumers.Doc(model.ConsumerDocID(ch.Topic, ch.ConsumerID))
	var (
		entry  ConsumerEntry
		logged *audit.Entry
	)
	// The change's outcome entry is written in its transaction when the
	// audit log shares the ledger's database (the local stack); when it has
	// a database of its own (production) it is returned unwritten (ID
	// empty) for the caller to append after the commit: the operations
	// API wrote its started entry before the change, so no change is ever
	// unaudited, and an outcome written before a commit that then failed
	// would claim a change that was never made.
	inTx := s.audit.Shares(s.client)
	err := s.client.RunTransaction(ctx, func(ctx context.Context, tx *firestore.Transaction) error {
		logged = nil
		now := s.clock()
		snap, err := fsdoc.Get(ctx, tx, ref)
		exists := err == nil
		if err != nil && !fsdoc.NotFound(err) {
			return err
		}
		switch {
		case ch.Add && exists:
			return fmt.Errorf("%w: %s on %s", ErrConsumerExists, ch.ConsumerID, ch.Topic)
		case !ch.Add && !exists:
			return fmt.Errorf("%w: %s on %s", ErrConsumerNotFound, ch.ConsumerID, ch.Topic)
		}
		var before ConsumerEntry
		if exists {
			if err := snap.DataTo(&before); err != nil {
				return fmt.Errorf("decode %s: %w", ref.ID, err)
			}
		}
		after := before
		var changes []string
		action := audit.ConsumerDescribe
		if ch.Add {
			after = ConsumerEntry{Topic: ch.Topic, ConsumerID: ch.ConsumerID, Enabled: true, CreatedAt: now}
			action = audit.ConsumerAdd
		}
		if ch.Enabled != nil && (ch.Add || *ch.Enabled != before.Enabled) {
			after.Enabled = *ch.Enabled
			if !ch.Add {
				action = map[bool]string{true: audit.ConsumerEnable, false: audit.ConsumerDisable}[after.Enabled]
				changes = append(changes, fmt.Sprintf("enabled: %v → %v", before.Enabled, after.Enabled))
			}
		}
		if ch.Description != nil && *ch.Description != before.Description {
			after.Description = *ch.Description
			changes = append(changes, fmt.Sprintf("description: %q → %q", before.Description, after.Description))
		}
		if ch.SortOrder != nil && *ch.SortOrder != before.SortOrder {
			after.SortOrder = *ch.SortOrder
			changes = append(changes, fmt.Sprintf("sortOrder: %d → %d", before.SortOrder, after.SortOrder))
		}
		if ch.Add {
			changes = append([]string{fmt.Sprintf("added, enabled: %v", after.Enabled)}, changes...)
		}
		if len(changes) == 0 {
			entry = before
			return nil
		}
		if before.Enabled && !after.Enabled {
			others, err := tx.Documents(s.consumers.Where("topic", "==", ch.Topic).Where("enabled", "==", true)).GetAll()
			if err != nil {
				return err
			}
			left := 0
			for _, d := range others {
				if d.Ref.ID != ref.ID {
					left++
				}
			}
			if left == 0 {
				if ch.KeepOneEnabled {
					return fmt.Errorf("%w: %s on %s", ErrLastConsumer, ch.ConsumerID, ch.Topic)
				}
				changes = append(changes, NoConsumerLeft)
			}
		}
		after.UpdatedAt, after.UpdatedBy = now, by
		rec := audit.Entry{At: now, By: by, Action: action, Topic: ch.Topic, ConsumerID: ch.ConsumerID, Detail: strings.Join(changes, "; "),
			Outcome: audit.OutcomeSucceeded, Method: ch.Audit.Method, RequestID: ch.Audit.RequestID, Ref: ch.Audit.Ref}
		if inTx {
			if rec, err = s.audit.AppendInTx(tx, rec); err != nil {
				return err
			}
		}
		if err := tx.Set(ref, after); err != nil {
			return err
		}
		entry, logged = after, &rec
		return nil
	})
	if err != nil {
		return ConsumerEntry{}, nil, fmt.Errorf("ledger: change consumer %s on %s: %w", ch.ConsumerID, ch.Topic, err)
	}
	return entry, logged, nil
}
