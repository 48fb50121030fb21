package ledger

import (
	"context"
	"fmt"
	"strings"
	"time"

	"cloud.google.com/go/firestore"
)

// CollectionAudit holds the operators' audit log: one document per write
// action taken through the operations API or its console (who, when, what).
const CollectionAudit = "operator_audit"

// Audit actions.
const (
	AuditConsumerAdd      = "consumer.add"
	AuditConsumerEnable   = "consumer.enable"
	AuditConsumerDisable  = "consumer.disable"
	AuditConsumerDescribe = "consumer.describe"
	AuditLetterReplay     = "deadletter.replay"
	AuditLetterBatch      = "deadletter.replay_batch"
	AuditLetterDelete     = "deadletter.delete"
	AuditEventRepush      = "event.repush"
	AuditSeek             = "subscription.seek"
	AuditSnapshot         = "snapshot.create"
)

// AuditEntry is one operator action.
type AuditEntry struct {
	// ID is the document id (assigned on write).
	ID string `firestore:"-" json:"id"`
	// At is when the action was taken, By the caller's identity (an email,
	// a token's name, or "anonymous" on an unauthenticated local stack).
	At time.Time `firestore:"at" json:"at"`
	By string    `firestore:"by" json:"by"`
	// Action is one of the Audit* constants.
	Action string `firestore:"action" json:"action"`
	// Target names what the action changed: a topic and consumer, a dead
	// letter, an event, a subscription.
	Topic        string `firestore:"topic,omitempty" json:"topic,omitempty"`
	ConsumerID   string `firestore:"consumerId,omitempty" json:"consumerId,omitempty"`
	EventID      string `firestore:"eventId,omitempty" json:"eventId,omitempty"`
	DeadLetterID string `firestore:"deadLetterId,omitempty" json:"deadLetterId,omitempty"`
	Subscription string `firestore:"subscription,omitempty" json:"subscription,omitempty"`
	// Detail says what changed, in words ("enabled: true → false").
	Detail string `firestore:"detail,omitempty" json:"detail,omitempty"`
}

// Audit appends an entry to the audit log; a zero At is now.
func (s *Store) Audit(ctx context.Context, e AuditEntry) (AuditEntry, error) {
	if e.At.IsZero() {
		e.At = s.clock()
	}
	ref := s.client.Collection(CollectionAudit).NewDoc()
	if _, err := ref.Create(ctx, e); err != nil {
		return AuditEntry{}, fmt.Errorf("ledger: audit %s: %w", e.Action, err)
	}
	e.ID = ref.ID
	return e, nil
}

// MaxAuditScan bounds how many entries AuditLog reads.
const MaxAuditScan = 1000

// AuditQuery selects audit entries; empty fields match everything.
type AuditQuery struct {
	// ActionPrefix selects actions that start with it ("consumer.").
	ActionPrefix string
	Topic        string
	ConsumerID   string
	// Limit is how many entries to return (50 when zero, at most
	// MaxAuditScan).
	Limit int
}

// AuditLog returns the newest entries matching q, newest first, reading at
// most MaxAuditScan entries.
func (s *Store) AuditLog(ctx context.Context, q AuditQuery) ([]AuditEntry, error) {
	limit := q.Limit
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, MaxAuditScan)
	fq := shapeAuditByTime.query(s.client.Collection(CollectionAudit).Query, nil).Limit(MaxAuditScan)
	docs, err := s.queryDocs(ctx, nil, fq)
	if err != nil {
		return nil, fmt.Errorf("ledger: audit log: %w", err)
	}
	out := []AuditEntry{}
	for _, d := range docs {
		var e AuditEntry
		if err := d.DataTo(&e); err != nil {
			return nil, fmt.Errorf("ledger: audit log: decode %s: %w", d.Ref.ID, err)
		}
		e.ID = d.Ref.ID
		if !strings.HasPrefix(e.Action, q.ActionPrefix) || (q.Topic != "" && e.Topic != q.Topic) || (q.ConsumerID != "" && e.ConsumerID != q.ConsumerID) {
			continue
		}
		out = append(out, e)
		if len(out) == limit {
			break
		}
	}
	return out, nil
}

// auditInTx writes an audit entry inside a transaction.
func (s *Store) auditInTx(tx *firestore.Transaction, e AuditEntry) (AuditEntry, error) {
	ref := s.client.Collection(CollectionAudit).NewDoc()
	if err := tx.Create(ref, e); err != nil {
		return AuditEntry{}, err
	}
	e.ID = ref.ID
	return e, nil
}
