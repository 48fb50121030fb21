package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/postgres"
)

var enqueueClaimSQL = query("enqueue_claim")

// raceMarker names the error enqueue_claim.sql raises when an id it did not
// insert was committed by another transaction while it ran.
const raceMarker = "relaybus-outbox-race"

// EnqueueClaim writes events into the outbox as Enqueue does and, in the
// same statement, leases for o.Owner (for o.Lease) each aggregate whose new
// versions are its only unpublished ones, at most o.RunLimit of them: not
// FAILED, not leased, not waiting out a retry, everything enqueued before
// it published. It returns, besides what Enqueue returns, the run of each
// aggregate it leased (the rows it inserted, in version order, as Claim
// would have read them back), to publish and Settle as a claim's. The
// other pending events are due as after Enqueue: the drain, or a Claim of
// their own, takes them.
//
// Meant for a pool, not a transaction: the statement commits on its own,
// one round trip for the write and the lease (a transaction around Enqueue
// and Claim takes four). It is still all or nothing: an id clash or a
// version conflict writes nothing (ErrEventIDConflict, ErrVersionConflict),
// and when another transaction commits an id of the batch while the
// statement runs, the statement fails and is run again, once, so the
// repeat is judged a duplicate or a clash on what it then sees. The lease
// is every claim's: a process that dies before publishing leaves the runs
// to the drain once it expires.
func EnqueueClaim(ctx context.Context, db postgres.DBTX, o ClaimOptions, events ...*event.Event) ([]Enqueued, []Run, error) {
	if len(events) == 0 {
		return nil, nil, nil
	}
	if o.Lease <= 0 || o.Owner == "" || o.RunLimit <= 0 {
		return nil, nil, errors.New("outbox: a claim needs an owner, a lease and a run limit")
	}
	b, err := prepareBatch(ctx, events)
	if err != nil {
		return nil, nil, err
	}
	args := append(b.args(), at(o.Now), o.Owner, o.Lease.Seconds(), o.RunLimit)
	res, err := enqueueClaim(ctx, db, args)
	if isRace(err) {
		res, err = enqueueClaim(ctx, db, args)
	}
	if err != nil {
		return nil, nil, err
	}
	if len(res.clashes) > 0 {
		return nil, nil, idConflict(res.clashes)
	}
	out, err := enqueued(ctx, db, events, func(id string) bool { _, ok := res.inserted[id]; return ok })
	if err != nil {
		return nil, nil, err
	}
	if len(res.leased) == 0 {
		return out, nil, nil
	}
	// Each leased aggregate's run: the rows the statement inserted for it
	// (all of its unpublished ones), in version order, as Claim reads them.
	runs := make([]Run, 0, len(res.leased))
	at := make(map[Aggregate]int, len(res.leased))
	for _, l := range res.leased {
		at[l.Aggregate] = len(runs)
		runs = append(runs, l)
	}
	for i := range b.id {
		a := Aggregate{b.aggType[i], b.aggID[i]}
		k, ok := at[a]
		created, ins := res.inserted[b.id[i]]
		if !ok || !ins {
			continue
		}
		runs[k].Rows = append(runs[k].Rows, b.row(i, created))
	}
	for k := range runs {
		rows := runs[k].Rows
		for i := 1; i < len(rows); i++ { // few rows: insertion sort by version
			for j := i; j > 0 && rows[j].Event.Version < rows[j-1].Event.Version; j-- {
				rows[j], rows[j-1] = rows[j-1], rows[j]
			}
		}
	}
	return out, runs, nil
}

// claimResult is what enqueue_claim.sql answered.
type claimResult struct {
	inserted map[string]time.Time // id -> created_at
	clashes  []string
	leased   []Run // without rows
}

func enqueueClaim(ctx context.Context, db postgres.DBTX, args []any) (claimResult, error) {
	res := claimResult{inserted: map[string]time.Time{}}
	rows, err := db.Query(ctx, enqueueClaimSQL, args...)
	if err != nil {
		return res, mapErr(err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			kind, id    string
			created     *time.Time
			aggType     *string
			epoch, from *int64
			attempts    *int32
		)
		if err := rows.Scan(&kind, &id, &created, &aggType, &epoch, &from, &attempts); err != nil {
			return res, mapErr(err)
		}
		switch kind {
		case "i":
			if created != nil {
				res.inserted[id] = created.UTC()
			}
		case "c":
			res.clashes = append(res.clashes, id)
		case "l":
			if aggType == nil || epoch == nil || from == nil || attempts == nil {
				return res, fmt.Errorf("outbox: enqueue and claim: lease of %s without its state", id)
			}
			res.leased = append(res.leased, Run{Aggregate: Aggregate{*aggType, id}, Epoch: *epoch, From: *from, Attempts: int(*attempts)})
		}
	}
	if err := rows.Err(); err != nil {
		return res, mapErr(err)
	}
	return res, nil
}

// isRace reports whether err is enqueue_claim.sql's failure on an id
// another transaction committed while it ran: its own marker, or the
// outbox's primary key (the insert skips the ids its snapshot holds only).
func isRace(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	return pg.Code == "22P02" && strings.Contains(pg.Message, raceMarker) ||
		pg.Code == "23505" && pg.ConstraintName == "relaybus_outbox_pkey"
}

// row is the batch's i-th event as Claim would read it back from the
// outbox: the columns the table keeps, times at the microsecond, UTC.
func (b *batch) row(i int, created time.Time) Row {
	e := event.Event{ID: b.id[i], AggregateType: b.aggType[i], AggregateID: b.aggID[i], Type: b.typ[i],
		Version: b.version[i], Payload: b.payload[i], OccurredAt: b.occurred[i].Truncate(time.Microsecond).UTC(),
		Topic: b.topic[i], Source: b.source[i], SchemaVersion: b.schema[i], PayloadType: b.payloadType[i],
		TraceID: b.trace[i], SpanID: b.span[i], ParentEventID: b.parent[i], CorrelationID: b.corr[i],
		Initiator: b.initiatorOf[i]}
	if v := b.sourceVersion[i]; v != nil {
		e.SourceVersion = *v
	}
	if x := b.expire[i]; x != nil {
		e.ExpireAt = x.Truncate(time.Microsecond).UTC()
	}
	r := Row{Event: e, Target: b.target[i], EnqueuedAt: created}
	if tp := b.traceparent[i]; tp != nil {
		r.Traceparent = *tp
	}
	return r
}
