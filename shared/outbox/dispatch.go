package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/postgres"
)

var (
	claimDrainSQL  = fmt.Sprintf(query("claim"), query("claim_due_drain"))
	claimEventsSQL = fmt.Sprintf(query("claim"), query("claim_due_events"))
	settleSQL      = fmt.Sprintf(query("settle"), "skipping the ones a producer holds", "SKIP LOCKED")
	settleWaitSQL  = fmt.Sprintf(query("settle"), "waiting for the ones a producer holds", "")
	releaseSQL     = query("release")
)

// Row is one claimed outbox row: the event and what the relay needs of it.
type Row struct {
	// Event is the event as enqueued.
	Event event.Event
	// Target, when not empty, addresses the event to that consumer alone (an
	// operator's re-push): the relay sets the target_consumer attribute.
	Target string
	// EnqueuedAt is when the producer's transaction wrote it.
	EnqueuedAt time.Time
	// Traceparent is the producer's W3C trace context at enqueue ("" when
	// telemetry was off).
	Traceparent string
}

// Run is one leased aggregate and its rows to publish.
type Run struct {
	Aggregate
	// Epoch is the lease's fence: only a Settle under this epoch moves the
	// cursor.
	Epoch int64
	// From is the published cursor when the run was claimed: Rows are the
	// versions above it, in order, a prefix of what is unpublished.
	From int64
	// Attempts is how many times publishing the first unpublished version
	// has failed so far.
	Attempts int
	// Rows may be empty (the claim's row cap ran out, or the first
	// unpublished version is scheduled after now); settle such a run with
	// nothing published, which releases it.
	Rows []Row
	// HeldAt, when not zero, is the deliver_at of the version after Rows:
	// it is scheduled after the claim's time, so the run stops before it,
	// and the settle makes the aggregate due then.
	HeldAt time.Time
}

// ClaimOptions say what Claim takes and for how long.
type ClaimOptions struct {
	// Owner names the claiming relay, for the operators' view.
	Owner string
	// Lease is how long the claim holds; a relay that dies mid-batch loses
	// its aggregates when the lease expires, and another relay takes them.
	Lease time.Duration
	// Aggregates is the most aggregates leased.
	Aggregates int
	// RunLimit is the most rows of one aggregate.
	RunLimit int
	// Limit is the most rows in all.
	Limit int
	// Events, when not empty, restricts the claim to the aggregates of these
	// events (the fast path, the post-commit kick).
	Events []string
	// Now is the time the claim is made at; zero means the database's clock.
	Now time.Time
}

// Claim leases due aggregates for one relay and returns each one's run: the
// rows above its published cursor, in version order. A due aggregate is
// one with unpublished work whose lease (if any) has expired and whose
// retry (if any) is due; FAILED aggregates are never due. A run ends
// before its first version scheduled after the claim's time (Run.HeldAt):
// a scheduled version holds the versions after it. Aggregates are
// locked FOR UPDATE SKIP LOCKED, so concurrent claims never take the same
// one, and a lease bumps the aggregate's epoch, so a relay whose lease
// expired cannot move the cursor after another relay took over. One
// statement does it all.
func Claim(ctx context.Context, db postgres.DBTX, o ClaimOptions) ([]Run, error) {
	if o.Limit <= 0 || o.Lease <= 0 || o.Owner == "" || o.Aggregates <= 0 || o.RunLimit <= 0 {
		return nil, errors.New("outbox: a claim needs an owner, a lease and its limits")
	}
	args := []any{at(o.Now), o.Owner, o.Lease.Seconds(), o.Aggregates, o.RunLimit, o.Limit}
	q := claimDrainSQL
	if len(o.Events) > 0 {
		q = claimEventsSQL
		args = append(args, o.Events)
	}
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	defer rows.Close()
	var out []Run
	for rows.Next() {
		var (
			run Run
			r   rowScan
		)
		if err := rows.Scan(append(append([]any{&run.Type, &run.ID, &run.Epoch, &run.From, &run.Attempts}, r.dest()...), &r.deliverAt, &r.held)...); err != nil {
			return nil, fmt.Errorf("outbox: claim: %w", err)
		}
		if n := len(out); n == 0 || out[n-1].Aggregate != run.Aggregate {
			out = append(out, run)
		}
		last := &out[len(out)-1]
		if r.id != nil && last.HeldAt.IsZero() {
			if r.held != nil && *r.held {
				last.HeldAt = r.deliverAt.UTC()
				continue
			}
			row, err := r.row(run.Aggregate)
			if err != nil {
				return nil, err
			}
			last.Rows = append(last.Rows, row)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	return out, nil
}

// rowScan receives an outbox row's columns, all nullable (a LEFT JOIN).
type rowScan struct {
	id, typ, topic, source, schema, payloadType *string
	trace, span, parent, corr, target           *string
	traceparent, sourceVersion                  *string
	version                                     *int64
	payload, initiator                          []byte
	occurred, expire, created, deliverAt        *time.Time
	held                                        *bool
}

func (r *rowScan) dest() []any {
	return []any{&r.id, &r.typ, &r.version, &r.payload, &r.occurred, &r.topic, &r.source, &r.schema,
		&r.payloadType, &r.trace, &r.span, &r.parent, &r.corr, &r.initiator, &r.expire, &r.target, &r.created, &r.traceparent, &r.sourceVersion}
}

func (r *rowScan) row(a Aggregate) (Row, error) {
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	e := event.Event{ID: *r.id, AggregateType: a.Type, AggregateID: a.ID, Type: str(r.typ), Payload: r.payload,
		Topic: str(r.topic), Source: str(r.source), SchemaVersion: str(r.schema), PayloadType: str(r.payloadType),
		TraceID: str(r.trace), SpanID: str(r.span), ParentEventID: str(r.parent), CorrelationID: str(r.corr),
		SourceVersion: str(r.sourceVersion)}
	if r.version != nil {
		e.Version = *r.version
	}
	if r.occurred != nil {
		e.OccurredAt = r.occurred.UTC()
	}
	if r.expire != nil {
		e.ExpireAt = r.expire.UTC()
	}
	if r.deliverAt != nil {
		e.DeliverAt = r.deliverAt.UTC()
	}
	if len(r.initiator) > 0 {
		if err := json.Unmarshal(r.initiator, &e.Initiator); err != nil {
			return Row{}, fmt.Errorf("outbox: row %s: initiator: %w", e.ID, err)
		}
	}
	row := Row{Event: e, Target: str(r.target), Traceparent: str(r.traceparent)}
	if r.created != nil {
		row.EnqueuedAt = r.created.UTC()
	}
	return row, nil
}

// Progress is what a relay did with one claimed run.
type Progress struct {
	Aggregate
	// Epoch and From are the run's.
	Epoch int64
	From  int64
	// To is the highest version Pub/Sub acknowledged (From when none), and
	// Rows how many rows that is.
	To   int64
	Rows int
	// Failure, when not nil, is the failed publish of the version after To.
	Failure *Failure
}

// Failure is a failed publish of an aggregate's first unpublished version.
type Failure struct {
	Version int64
	Error   string
	// RetryAt is when the aggregate is due again; Final makes it FAILED
	// instead (blocked until an operator re-pushes).
	RetryAt time.Time
	Final   bool
}

// SettleOptions say how Settle records a batch.
type SettleOptions struct {
	// Ledger is true when the ledger records sends: settled aggregates then
	// join the ledger's healing queue after HealDelay, unless the live
	// recorder reports them recorded first (LedgerRecorded).
	Ledger    bool
	HealDelay time.Duration
	// Now is the time; zero means the database's clock.
	Now time.Time
}

// Settled says what Settle did with one aggregate.
type Settled struct {
	Aggregate
	// Moved is true when the cursor moved to the run's To; false when the
	// relay had lost its lease (another relay took the aggregate over, or a
	// late version pulled the cursor back) or a version committed inside the
	// run after it was read: then nothing of the run counts as published
	// and it will be published again.
	Moved bool
	// Next, when not empty, is the event of the aggregate's first
	// unpublished version: versions were enqueued while the run was leased,
	// and the aggregate is due again at once (a caller that settles in the
	// background kicks it).
	Next string
}

// Settle ends the leases of a batch and records each run's outcome: the
// cursor moves over what Pub/Sub acknowledged, a failure schedules a retry
// (or makes the aggregate FAILED), and an aggregate with more work is due
// again at once (behind the others: claims take the oldest due first). One
// statement settles the batch; aggregates that a producer's open
// transaction holds (it is enqueuing for them right now) are settled after
// it commits, one statement each, so one slow producer never holds up the
// batch. An aggregate whose lease was lost is reported, not settled.
func Settle(ctx context.Context, db postgres.DBTX, o SettleOptions, ps []Progress) ([]Settled, error) {
	if len(ps) == 0 {
		return nil, nil
	}
	done, err := settle(ctx, db, settleSQL, o, ps)
	if err != nil {
		return nil, err
	}
	out := make([]Settled, 0, len(ps))
	var rest []Progress
	for _, p := range ps {
		if st, ok := done[p.Aggregate]; ok {
			out = append(out, Settled{Aggregate: p.Aggregate, Moved: st.Moved, Next: st.Next})
		} else {
			rest = append(rest, p)
		}
	}
	var lost []Progress
	for _, p := range rest {
		done, err := settle(ctx, db, settleWaitSQL, o, []Progress{p})
		if err != nil {
			return nil, err
		}
		st, ok := done[p.Aggregate]
		if !ok {
			lost = append(lost, p)
		}
		out = append(out, Settled{Aggregate: p.Aggregate, Moved: st.Moved, Next: st.Next})
	}
	// Not settled: the lease was taken over (then release changes nothing),
	// or a late version pulled the cursor back under the run (then the lease
	// is still ours: free it, so the aggregate is due again).
	if err := release(ctx, db, o.Now, lost); err != nil {
		return nil, err
	}
	return out, nil
}

func settle(ctx context.Context, db postgres.DBTX, q string, o SettleOptions, ps []Progress) (map[Aggregate]Settled, error) {
	n := len(ps)
	types, ids := make([]string, n), make([]string, n)
	epochs, from, to := make([]int64, n), make([]int64, n), make([]int64, n)
	counts := make([]int32, n)
	failV := make([]*int64, n)
	failE := make([]*string, n)
	retry := make([]*time.Time, n)
	final := make([]bool, n)
	for i, p := range ps {
		types[i], ids[i], epochs[i], from[i], to[i], counts[i] = p.Type, p.ID, p.Epoch, p.From, p.To, int32(p.Rows)
		if f := p.Failure; f != nil {
			v, e, r := f.Version, f.Error, f.RetryAt
			failV[i], failE[i], retry[i], final[i] = &v, &e, &r, f.Final
		}
	}
	rows, err := db.Query(ctx, q, at(o.Now), types, ids, epochs, from, to, counts, failV, failE, retry, final,
		o.Ledger, o.HealDelay.Seconds())
	if err != nil {
		return nil, fmt.Errorf("outbox: settle: %w", err)
	}
	defer rows.Close()
	done := make(map[Aggregate]Settled, n)
	for rows.Next() {
		var st Settled
		var next *string
		if err := rows.Scan(&st.Type, &st.ID, &st.Moved, &next); err != nil {
			return nil, fmt.Errorf("outbox: settle: %w", err)
		}
		if next != nil {
			st.Next = *next
		}
		done[st.Aggregate] = st
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: settle: %w", err)
	}
	return done, nil
}

func release(ctx context.Context, db postgres.DBTX, now time.Time, ps []Progress) error {
	if len(ps) == 0 {
		return nil
	}
	types, ids, epochs := make([]string, len(ps)), make([]string, len(ps)), make([]int64, len(ps))
	for i, p := range ps {
		types[i], ids[i], epochs[i] = p.Type, p.ID, p.Epoch
	}
	if _, err := db.Exec(ctx, releaseSQL, at(now), types, ids, epochs); err != nil {
		return fmt.Errorf("outbox: release: %w", err)
	}
	return nil
}

// at is a time for a query's $now: nil (the database's clock) when zero.
func at(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
