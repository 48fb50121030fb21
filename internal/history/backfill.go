// Package history runs backfills: one consumer fed the published events of
// a topic (the outbox's and the history's, migration 009 of the outbox),
// scoped by time and aggregate, at a bounded rate, pausable and resumable
// (docs/history.md).
//
// A backfill queues its events as re-pushes addressed to its consumer
// (the target_consumer attribute, which every other consumer's
// subscription filters out and every other consume engine ignores), so the
// relay publishes them and the consumer takes them through its own
// handler, inbox and version gate, exactly as live delivery: an event it
// already has is a duplicate, and a live version that arrives before its
// backfilled predecessors is parked (strict) or supersedes them
// (projection) as any out-of-order delivery is.
//
// The backfill's state and cursor are a row of relaybus_outbox_backfill in
// the same database as the events: one statement queues the next batch and
// moves the cursor (sql/step.sql), so whatever pauses, resumes or crashes,
// every event of the scope is queued once.
package history

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/shared/postgres"
)

// Backfill states.
const (
	StateRunning   = "running"
	StatePaused    = "paused"
	StateCancelled = "cancelled"
	StateDone      = "done"
)

// Bounds.
const (
	// DefaultRate is a backfill's rate (events per second queued) when its
	// Spec names none; MaxRate is the highest it takes.
	DefaultRate = 1000
	MaxRate     = 100000
	// MaxAggregates is how many aggregate ids one backfill may name.
	MaxAggregates = 1000
	// stepEvery is how often Run queues a batch (rate × stepEvery events).
	stepEvery = 100 * time.Millisecond
)

var (
	// ErrNotFound: no backfill has the id.
	ErrNotFound = errors.New("history: no backfill has that id")
	// ErrState: the action does not apply to the backfill's state (a
	// *StateError says which).
	ErrState = errors.New("history: the backfill is not in a state the action applies to")
)

// StateError is an action refused in the backfill's state.
type StateError struct {
	ID, Action, State string
}

func (e *StateError) Error() string {
	return fmt.Sprintf("history: backfill %s is %s: it cannot be %s", e.ID, e.State, e.Action)
}

// Is makes a StateError an ErrState.
func (e *StateError) Is(target error) bool { return target == ErrState }

// Spec is what a backfill delivers, to whom and how fast.
type Spec struct {
	// Topic and Consumer: the events of Topic, to Consumer alone.
	Topic, Consumer string
	// Since (inclusive) and Until (exclusive) bound when the events
	// occurred.
	Since, Until time.Time
	// Aggregates, when set, are the only aggregate ids delivered.
	Aggregates []string
	// Rate is the most events per second queued (DefaultRate when 0).
	Rate float64
	// By names who asked (the audit's caller).
	By string
}

// Backfill is a backfill's state and progress.
type Backfill struct {
	ID         string    `json:"id"`
	Topic      string    `json:"topic"`
	Consumer   string    `json:"consumer"`
	Since      time.Time `json:"since"`
	Until      time.Time `json:"until"`
	Aggregates []string  `json:"aggregates"`
	Rate       float64   `json:"rate"`
	State      string    `json:"state"`
	// Matched is how many events the scope held when the backfill was
	// created; Queued how many it has queued for the relay so far.
	Matched int64 `json:"matched"`
	Queued  int64 `json:"queued"`
	// Cursor is the last event queued: its aggregate and version.
	CursorType    string     `json:"cursorAggregateType,omitempty"`
	CursorID      string     `json:"cursorAggregateId,omitempty"`
	CursorVersion int64      `json:"cursorVersion,omitempty"`
	CreatedBy     string     `json:"createdBy"`
	CreatedAt     time.Time  `json:"createdAt"`
	StartedAt     *time.Time `json:"startedAt,omitempty"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	FinishedAt    *time.Time `json:"finishedAt,omitempty"`
	// Remaining, MeasuredRate (events/s since the first step) and
	// ETASeconds (the remaining events at the lower of the measured and
	// the set rate) are computed when read.
	Remaining    int64   `json:"remaining"`
	MeasuredRate float64 `json:"measuredRate"`
	ETASeconds   float64 `json:"etaSeconds"`
}

// progress fills in the computed fields as of now.
func (b *Backfill) progress(now time.Time) {
	b.Remaining, b.MeasuredRate, b.ETASeconds = 0, 0, 0
	if b.State == StateRunning || b.State == StatePaused {
		b.Remaining = max(b.Matched-b.Queued, 0)
	}
	if b.StartedAt == nil || b.Queued == 0 {
		return
	}
	end := b.UpdatedAt
	if b.State == StateRunning {
		end = now
	}
	if el := end.Sub(*b.StartedAt).Seconds(); el > 0 {
		b.MeasuredRate = float64(b.Queued) / el
		b.ETASeconds = float64(b.Remaining) / min(b.MeasuredRate, b.Rate)
	}
}

//go:embed sql/scope.sql
var scopeSQL string

//go:embed sql/step.sql
var stepTemplate string

const columns = "id, topic, consumer, since, until, aggregates, rate, state, matched, queued, cursor_type, cursor_id, " +
	"cursor_version, created_by, created_at, started_at, updated_at, finished_at"

var (
	countSQL = "SELECT count(*) FROM (" + scopeSQL + ") s"
	// stepSQL reads the scope with the job's own columns for $1..$8 and
	// the batch size for $9.
	stepSQL = fmt.Sprintf(stepTemplate, regexp.MustCompile(`\$\d`).ReplaceAllStringFunc(scopeSQL, func(p string) string {
		return map[string]string{"$1": "job.topic", "$2": "job.since", "$3": "job.until", "$4": "job.aggregates",
			"$5": "job.consumer", "$6": "job.cursor_type", "$7": "job.cursor_id", "$8": "job.cursor_version", "$9": "$2"}[p]
	}), "b."+strings.ReplaceAll(columns, ", ", ", b."))
)

func scan(row pgx.Row) (Backfill, error) {
	var b Backfill
	err := row.Scan(&b.ID, &b.Topic, &b.Consumer, &b.Since, &b.Until, &b.Aggregates, &b.Rate, &b.State, &b.Matched, &b.Queued,
		&b.CursorType, &b.CursorID, &b.CursorVersion, &b.CreatedBy, &b.CreatedAt, &b.StartedAt, &b.UpdatedAt, &b.FinishedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Backfill{}, ErrNotFound
	}
	if b.Aggregates == nil {
		b.Aggregates = []string{}
	}
	b.Since, b.Until, b.CreatedAt, b.UpdatedAt = b.Since.UTC(), b.Until.UTC(), b.CreatedAt.UTC(), b.UpdatedAt.UTC()
	return b, err
}

func aggregates(s Spec) []string {
	if s.Aggregates == nil {
		return []string{}
	}
	return s.Aggregates
}

// Count answers how many events the spec's scope holds now (a dry run).
func Count(ctx context.Context, db postgres.DBTX, s Spec) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, countSQL, s.Topic, s.Since, s.Until, aggregates(s), s.Consumer, "", "", int64(0), nil).Scan(&n); err != nil {
		return 0, fmt.Errorf("history: count: %w", err)
	}
	return n, nil
}

// NewID returns a new backfill id.
func NewID(now time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "bf-" + now.UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b[:])
}

// Start creates a running backfill of the spec (the caller validated it)
// with id, counting its scope, and returns it. It queues nothing: Step and
// Run do.
func Start(ctx context.Context, db postgres.DBTX, id string, s Spec) (Backfill, error) {
	if s.Rate == 0 {
		s.Rate = DefaultRate
	}
	n, err := Count(ctx, db, s)
	if err != nil {
		return Backfill{}, err
	}
	b, err := scan(db.QueryRow(ctx, `INSERT INTO relaybus_outbox_backfill (id, topic, consumer, since, until, aggregates, rate, matched, created_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING `+columns, id, s.Topic, s.Consumer, s.Since, s.Until, aggregates(s), s.Rate, n, s.By))
	if err != nil {
		return Backfill{}, fmt.Errorf("history: start backfill: %w", err)
	}
	b.progress(time.Now())
	return b, nil
}

// Get returns the backfill with id (ErrNotFound when none).
func Get(ctx context.Context, db postgres.DBTX, id string) (Backfill, error) {
	b, err := scan(db.QueryRow(ctx, `SELECT `+columns+` FROM relaybus_outbox_backfill WHERE id = $1`, id))
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Backfill{}, fmt.Errorf("history: get backfill %s: %w", id, err)
	}
	b.progress(time.Now())
	return b, err
}

// List returns up to limit backfills, newest first.
func List(ctx context.Context, db postgres.DBTX, limit int) ([]Backfill, error) {
	rows, err := db.Query(ctx, `SELECT `+columns+` FROM relaybus_outbox_backfill ORDER BY created_at DESC, id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("history: list backfills: %w", err)
	}
	defer rows.Close()
	out := []Backfill{}
	now := time.Now()
	for rows.Next() {
		b, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("history: list backfills: %w", err)
		}
		b.progress(now)
		out = append(out, b)
	}
	return out, rows.Err()
}

// Actions on a backfill's state.
const (
	ActionPause  = "pause"
	ActionResume = "resume"
	ActionCancel = "cancel"
)

// Set applies an action: pause (running → paused), resume (paused →
// running) or cancel (running or paused → cancelled). A backfill in
// another state is refused with a *StateError. A step under way when it
// pauses or cancels completes first (the row lock orders them).
func Set(ctx context.Context, db postgres.DBTX, id, action string) (Backfill, error) {
	from, to := map[string][]string{ActionPause: {StateRunning}, ActionResume: {StatePaused}, ActionCancel: {StateRunning, StatePaused}}[action],
		map[string]string{ActionPause: StatePaused, ActionResume: StateRunning, ActionCancel: StateCancelled}[action]
	if to == "" {
		return Backfill{}, fmt.Errorf("history: unknown action %q (pause, resume or cancel)", action)
	}
	b, err := scan(db.QueryRow(ctx, `UPDATE relaybus_outbox_backfill SET state = $2, updated_at = now(),
		finished_at = CASE WHEN $2 = 'cancelled' THEN now() END
		WHERE id = $1 AND state = ANY ($3) RETURNING `+columns, id, to, from))
	if errors.Is(err, ErrNotFound) {
		cur, gerr := Get(ctx, db, id)
		if gerr != nil {
			return Backfill{}, gerr
		}
		return cur, &StateError{ID: id, Action: map[string]string{ActionPause: "paused", ActionResume: "resumed", ActionCancel: "cancelled"}[action], State: cur.State}
	}
	if err != nil {
		return Backfill{}, fmt.Errorf("history: %s backfill %s: %w", action, id, err)
	}
	b.progress(time.Now())
	return b, nil
}

// Step queues the next n events of a running backfill and returns it
// after the step and how many it queued (0 and the backfill as it is when
// it is not running).
func Step(ctx context.Context, db postgres.DBTX, id string, n int) (Backfill, int, error) {
	before, err := Get(ctx, db, id)
	if err != nil || before.State != StateRunning {
		return before, 0, err
	}
	b, err := scan(db.QueryRow(ctx, stepSQL, id, n))
	if errors.Is(err, ErrNotFound) { // paused or cancelled meanwhile
		b, err = Get(ctx, db, id)
		return b, 0, err
	}
	if err != nil {
		return Backfill{}, 0, fmt.Errorf("history: step backfill %s: %w", id, err)
	}
	b.progress(time.Now())
	return b, int(b.Queued - before.Queued), nil
}

// Run steps a running backfill at its rate until it is done, paused or
// cancelled, ctx ends, or until passes, and returns it as it left it. A
// later Run (on any instance) continues from its cursor.
func Run(ctx context.Context, db postgres.DBTX, id string, until time.Time) (Backfill, error) {
	b, err := Get(ctx, db, id)
	if err != nil {
		return b, err
	}
	batch := max(int(b.Rate*stepEvery.Seconds()), 1)
	every := time.Duration(float64(batch) / b.Rate * float64(time.Second))
	t := time.NewTicker(every)
	defer t.Stop()
	for b.State == StateRunning && time.Now().Before(until) {
		if b, _, err = Step(ctx, db, id, batch); err != nil || b.State != StateRunning {
			return b, err
		}
		select {
		case <-ctx.Done():
			return b, nil
		case <-t.C:
		}
	}
	return b, nil
}
