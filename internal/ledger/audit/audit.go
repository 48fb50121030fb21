// Package audit is the operators' audit log in Firestore: who did what
// through the operations API or its console, when, and how it ended. The
// API writes an entry before each action (outcome started; an entry it
// cannot write refuses the action) and one after it (succeeded or failed,
// Ref naming the first), one for each payload read (read) and one for each
// refusal (refused), always with the identity the API verified.
//
// In production the log is a database of its own (dlqreplay's
// FIRESTORE_AUDIT_DATABASE), where only dlqreplay's identity may create
// and read documents and nobody may change or delete one at run time
// (infra/terraform, firestore.tf); left unset (the local stack), it is the
// ledger's database. Entries are written with Create only, never Set or
// Update, so a role that may create and not update (Terraform's
// relaybusAuditAppender) is all the writer needs.
package audit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Collection holds the audit log.
const Collection = "operator_audit"

// FieldAt is the field the log is read newest first by (a handful of
// writes a day: its single-field index is no hotspot).
const FieldAt = "at"

// Actions.
const (
	ConsumerAdd      = "consumer.add"
	ConsumerEnable   = "consumer.enable"
	ConsumerDisable  = "consumer.disable"
	ConsumerDescribe = "consumer.describe"
	LetterReplay     = "deadletter.replay"
	LetterBatch      = "deadletter.replay_batch"
	LetterDelete     = "deadletter.delete"
	EventRepush      = "event.repush"
	EventCancel      = "event.cancel"
	Seek             = "subscription.seek"
	Snapshot         = "snapshot.create"
	ConsumerPause    = "consumer.pause"
	ConsumerResume   = "consumer.resume"
	ConsumerRebuild  = "consumer.rebuild"
	GapsSkip         = "gaps.skip"
	// SubjectErase is an erasure by subject (its detail names the subject
	// by its keyed hash, never in plain text).
	SubjectErase = "subject.erase"
	// ReplayJob is a replay job (functions/dlqreplay's POST /replays):
	// one started entry when it is created, one outcome when it ends;
	// ReplayJobCancel an operator's cancel of one.
	ReplayJob       = "replay.job"
	ReplayJobCancel = "replay.job_cancel"
	LetterArchive   = "deadletter.archive"
	// Backfill is a backfill's creation (functions/dlqreplay's POST
	// /backfills); BackfillControl an operator's pause, resume or cancel.
	Backfill        = "backfill.create"
	BackfillControl = "backfill.control"
	// ForwarderAdd, ForwarderChange and ForwarderRemove are the edits of
	// the forward consumers added at run time (functions/dlqreplay's
	// /forwarders).
	ForwarderAdd    = "forwarder.add"
	ForwarderChange = "forwarder.change"
	ForwarderRemove = "forwarder.remove"
	// Reads of payloads, and of the audit log itself.
	EventRead  = "event.read"
	LetterRead = "deadletter.read"
	LetterList = "deadletter.list"
	Read       = "read"
)

// Outcomes (Entry.Outcome).
const (
	// OutcomeStarted: written before the action; the action is taken only
	// once it is written.
	OutcomeStarted = "started"
	// OutcomeSucceeded and OutcomeFailed: written after it, Ref naming
	// the started entry. A started entry without one means the outcome
	// could not be written (the service's log has it under RequestID).
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
	// OutcomeRefused: the caller lacked the right (Detail says which).
	OutcomeRefused = "refused"
	// OutcomeRead: a payload was read.
	OutcomeRead = "read"
)

// Entry is one operator action.
type Entry struct {
	// ID is the document id (assigned on write).
	ID string `firestore:"-" json:"id"`
	// At is when the action was taken, By the caller's identity (an email,
	// a token's name, or "anonymous" on an unauthenticated local stack).
	At time.Time `firestore:"at" json:"at"`
	By string    `firestore:"by" json:"by"`
	// Action is one of the action constants.
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
	// Outcome is one of the Outcome constants ("" on entries written
	// before outcomes existed: the change was made).
	Outcome string `firestore:"outcome,omitempty" json:"outcome,omitempty"`
	// Method is how the API verified By (its auth mode).
	Method string `firestore:"method,omitempty" json:"method,omitempty"`
	// RequestID ties the entry to the request and its log lines.
	RequestID string `firestore:"requestId,omitempty" json:"requestId,omitempty"`
	// Ref is, on an outcome, the id of the entry that started the action.
	Ref string `firestore:"ref,omitempty" json:"ref,omitempty"`
}

// Log appends to and reads the audit log.
type Log struct {
	client *firestore.Client
	now    func() time.Time
}

// New returns the audit log in c's database; now stamps entries without a
// time (time.Now when nil).
func New(c *firestore.Client, now func() time.Time) *Log {
	if now == nil {
		now = time.Now
	}
	return &Log{client: c, now: now}
}

// Append appends an entry to the audit log; a zero At is now. An entry
// with an ID is written under that id, once: appending it again (a
// retried transaction's) leaves the first one and succeeds.
func (l *Log) Append(ctx context.Context, e Entry) (Entry, error) {
	if e.At.IsZero() {
		e.At = l.now().UTC()
	}
	ref := l.client.Collection(Collection).NewDoc()
	if e.ID != "" {
		ref = l.client.Collection(Collection).Doc(e.ID)
	}
	if _, err := ref.Create(ctx, e); err != nil && status.Code(err) != codes.AlreadyExists {
		return Entry{}, fmt.Errorf("audit: %s: %w", e.Action, err)
	}
	e.ID = ref.ID
	return e, nil
}

// NewID returns a fresh entry id, for an entry appended from a
// transaction that may run more than once (Append writes it once).
func (l *Log) NewID() string { return l.client.Collection(Collection).NewDoc().ID }

// Shares reports whether the log is in the database of c, so that
// AppendInTx can write an entry in c's transactions; a log in a database
// of its own cannot, and its entries are appended first (Append).
func (l *Log) Shares(c *firestore.Client) bool { return l.client == c }

// AppendInTx writes an entry inside a transaction, with the change it
// records.
func (l *Log) AppendInTx(tx *firestore.Transaction, e Entry) (Entry, error) {
	ref := l.client.Collection(Collection).NewDoc()
	if err := tx.Create(ref, e); err != nil {
		return Entry{}, err
	}
	e.ID = ref.ID
	return e, nil
}

// MaxScan bounds how many entries List reads.
const MaxScan = 1000

// Query selects audit entries; empty fields match everything.
type Query struct {
	// ActionPrefix selects actions that start with it ("consumer.").
	ActionPrefix string
	Topic        string
	ConsumerID   string
	// Outcome selects one outcome (OutcomeSucceeded: the changes made).
	Outcome string
	// Limit is how many entries to return (50 when zero, at most
	// MaxScan).
	Limit int
}

// List returns the newest entries matching q, newest first, reading at
// most MaxScan entries.
func (l *Log) List(ctx context.Context, q Query) ([]Entry, error) {
	limit := q.Limit
	if limit <= 0 {
		limit = 50
	}
	limit = min(limit, MaxScan)
	docs, err := l.client.Collection(Collection).OrderBy(FieldAt, firestore.Desc).Limit(MaxScan).Documents(ctx).GetAll()
	if err != nil {
		return nil, fmt.Errorf("audit: list: %w", err)
	}
	out := []Entry{}
	for _, d := range docs {
		var e Entry
		if err := d.DataTo(&e); err != nil {
			return nil, fmt.Errorf("audit: list: decode %s: %w", d.Ref.ID, err)
		}
		e.ID = d.Ref.ID
		if !strings.HasPrefix(e.Action, q.ActionPrefix) || (q.Topic != "" && e.Topic != q.Topic) || (q.ConsumerID != "" && e.ConsumerID != q.ConsumerID) ||
			(q.Outcome != "" && e.Outcome != q.Outcome) {
			continue
		}
		out = append(out, e)
		if len(out) == limit {
			break
		}
	}
	return out, nil
}
