package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/migrate"
)

// Row is one claimed outbox row: the event and its dispatch state.
type Row struct {
	// Event is the event as enqueued.
	Event event.Event
	// Attempts is how many times publishing it has failed so far.
	Attempts int
	// Target, when not empty, addresses the event to that consumer alone (an
	// operator's re-push): the relay sets the target_consumer attribute.
	Target string
}

// ClaimOptions say what Claim takes and for how long.
type ClaimOptions struct {
	// Owner names the claiming relay; it is written as the lease owner.
	Owner string
	// Lease is how long the claim holds; a relay that dies mid-batch loses
	// its rows when the lease expires, and another relay takes them over.
	Lease time.Duration
	// Limit is the most rows one claim returns.
	Limit int
	// Aggregates, when not empty, restricts the claim to these aggregates
	// (publish's fast path); each is {aggregatetype, aggregateid}.
	Aggregates [][2]string
	// Upto, with Aggregates, stops each aggregate's run at this version: the
	// fast path claims the rows it wrote and what must go before them.
	Upto map[[2]string]int64
}

// Claim leases work for one relay in one transaction and returns it grouped
// by aggregate, each aggregate's rows in version order.
//
// Only an aggregate's head (its lowest unpublished version) can start a
// claim, and only when it is due (no retry scheduled in the future), not
// FAILED and not leased by a live relay; its row is locked FOR UPDATE SKIP
// LOCKED, so concurrent claims never take the same aggregate. Behind each
// head, the rest of the aggregate's pending rows are leased in version order
// while the limit allows. The head stays the same row until it is marked
// published, which happens only after Pub/Sub acknowledged it, so version
// n+1 of an aggregate is never handed to Pub/Sub before version n was, by
// this relay or any other.
func Claim(ctx context.Context, db migrate.Beginner, o ClaimOptions) ([][]Row, error) {
	if o.Limit <= 0 || o.Lease <= 0 || o.Owner == "" {
		return nil, fmt.Errorf("outbox: claim needs an owner, a lease and a limit")
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op

	var aggTypes, aggIDs []string
	var upto []int64
	for _, a := range o.Aggregates {
		aggTypes = append(aggTypes, a[0])
		aggIDs = append(aggIDs, a[1])
		v, ok := o.Upto[a]
		if !ok {
			v = 1<<62 - 1
		}
		upto = append(upto, v)
	}
	// A relay that died mid-batch left leases; once expired, its rows are
	// claimable again.
	if _, err := tx.Exec(ctx, `UPDATE relaybus_outbox SET lease_owner = NULL, lease_expires_at = NULL
		WHERE lease_owner IS NOT NULL AND lease_expires_at <= now() AND published_at IS NULL`); err != nil {
		return nil, fmt.Errorf("outbox: claim: expire leases: %w", err)
	}
	q := drainClaimSQL
	if len(o.Aggregates) > 0 {
		q = aggregateClaimSQL
	}
	rows, err := tx.Query(ctx, q, o.Owner, o.Lease.Seconds(), o.Limit, aggTypes, aggIDs, upto)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	var out [][]Row
	index := map[[2]string]int{}
	for rows.Next() {
		var (
			r         Row
			initiator []byte
			expire    *time.Time
			target    *string
		)
		e := &r.Event
		if err := rows.Scan(&e.ID, &e.AggregateType, &e.AggregateID, &e.Type, &e.Version, &e.Payload, &e.OccurredAt,
			&e.Topic, &e.Source, &e.SchemaVersion, &e.PayloadType, &e.TraceID, &e.SpanID, &e.ParentEventID,
			&e.CorrelationID, &initiator, &expire, &target, &r.Attempts); err != nil {
			rows.Close()
			return nil, fmt.Errorf("outbox: claim: %w", err)
		}
		if len(initiator) > 0 {
			if err := json.Unmarshal(initiator, &e.Initiator); err != nil {
				rows.Close()
				return nil, fmt.Errorf("outbox: claim: row %s: initiator: %w", e.ID, err)
			}
		}
		if expire != nil {
			e.ExpireAt = expire.UTC()
		}
		e.OccurredAt = e.OccurredAt.UTC()
		if target != nil {
			r.Target = *target
		}
		k := [2]string{e.AggregateType, e.AggregateID}
		i, ok := index[k]
		if !ok {
			i = len(out)
			index[k] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	// RETURNING has no order: put each run back in version order.
	for _, run := range out {
		slices.SortFunc(run, func(a, b Row) int { return cmp.Compare(a.Event.Version, b.Event.Version) })
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	return out, nil
}

// The claim statements: $1 owner, $2 lease seconds, $3 limit, $4/$5 the
// aggregates to restrict to, $6 each one's last version to claim. They
// differ in how they find heads: the scheduled drain walks the claimable
// rows in enqueue order and keeps those that are their aggregate's lowest
// unpublished version; the fast path looks up the heads of the aggregates
// it was given (an index probe each), whatever the backlog.
const (
	wantCTE = `
WITH want AS (
	SELECT * FROM unnest($4::text[], $5::text[], $6::bigint[]) AS w(aggregatetype, aggregateid, upto)
)`
	// claimable is what a head must be to start a claim.
	claimable = `o.published_at IS NULL AND o.failed_at IS NULL
	  AND (o.next_retry_at IS NULL OR o.next_retry_at <= now())
	  AND o.lease_owner IS NULL`
	drainHeads = `, heads AS (
	SELECT o.id, o.aggregatetype, o.aggregateid, o.version, o.seq
	FROM relaybus_outbox o
	WHERE ` + claimable + `
	  AND o.version = (SELECT min(p.version) FROM relaybus_outbox p
	                   WHERE p.aggregatetype = o.aggregatetype AND p.aggregateid = o.aggregateid AND p.published_at IS NULL)
	ORDER BY o.seq
	LIMIT $3
	FOR UPDATE SKIP LOCKED
)`
	aggregateHeads = `, candidates AS (
	SELECT h.id FROM want w CROSS JOIN LATERAL (
		SELECT p.id FROM relaybus_outbox p
		WHERE p.aggregatetype = w.aggregatetype AND p.aggregateid = w.aggregateid AND p.published_at IS NULL
		ORDER BY p.version LIMIT 1) h
), heads AS (
	SELECT o.id, o.aggregatetype, o.aggregateid, o.version, o.seq
	FROM relaybus_outbox o
	WHERE o.id IN (SELECT id FROM candidates) AND ` + claimable + `
	ORDER BY o.seq
	LIMIT $3
	FOR UPDATE SKIP LOCKED
)`
	claimRest = `, runs AS (
	SELECT r.id, h.seq AS head_seq,
	       row_number() OVER (PARTITION BY h.id ORDER BY r.version) AS k
	FROM heads h
	CROSS JOIN LATERAL (
		SELECT p.id, p.version FROM relaybus_outbox p
		WHERE p.aggregatetype = h.aggregatetype AND p.aggregateid = h.aggregateid
		  AND p.published_at IS NULL AND p.failed_at IS NULL
		  AND p.version <= coalesce((SELECT w.upto FROM want w WHERE w.aggregatetype = h.aggregatetype AND w.aggregateid = h.aggregateid), 9223372036854775807)
		ORDER BY p.version
		-- No aggregate can get more than its round-robin share.
		LIMIT (SELECT $3 / count(*) + 1 FROM heads)
	) r
), ranked AS (
	-- Heads first (k = 1), then the runs behind them round-robin, so every
	-- head is leased (a claim never locks a head it does not lease) and each
	-- aggregate's leased rows are a prefix of its run.
	SELECT id, row_number() OVER (ORDER BY k, head_seq) AS n FROM runs
), chosen AS (
	SELECT id FROM ranked WHERE n <= $3
)
UPDATE relaybus_outbox o
SET lease_owner = $1, lease_expires_at = now() + make_interval(secs => $2)
WHERE o.id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING o.id, o.aggregatetype, o.aggregateid, o.event_type, o.version, o.payload, o.occurred_at,
	o.topic, o.source, o.schema_version, o.payload_type, o.trace_id, o.span_id, o.parent_event_id,
	o.correlation_id, o.initiator, o.expire_at, o.target_consumer, o.attempts`
	drainClaimSQL     = wantCTE + drainHeads + claimRest
	aggregateClaimSQL = wantCTE + aggregateHeads + claimRest
)

// Published marks rows as published now (Pub/Sub acknowledged them) and
// ends their lease. ledgerBehind says the ledger has not recorded their send.
func Published(ctx context.Context, db DBTX, ids []string, ledgerBehind bool) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := db.Exec(ctx, `UPDATE relaybus_outbox
		SET published_at = coalesce(published_at, now()), lease_owner = NULL, lease_expires_at = NULL,
		    next_retry_at = NULL, ledger_behind = $2
		WHERE id = ANY($1)`, ids, ledgerBehind)
	if err != nil {
		return fmt.Errorf("outbox: mark published: %w", err)
	}
	return nil
}

// Retry records a failed publish of one row: attempts + 1, the error, and
// either a retry at retryAt or, when final, the row FAILED (kept for an
// operator; it blocks its aggregate until re-pushed). The lease ends.
func Retry(ctx context.Context, db DBTX, id string, lastError string, retryAt time.Time, final bool) error {
	_, err := db.Exec(ctx, `UPDATE relaybus_outbox
		SET attempts = attempts + 1, last_error = $2, lease_owner = NULL, lease_expires_at = NULL,
		    next_retry_at = CASE WHEN $4 THEN NULL ELSE $3::timestamptz END,
		    failed_at = CASE WHEN $4 THEN now() ELSE NULL END
		WHERE id = $1 AND published_at IS NULL`, id, lastError, retryAt, final)
	if err != nil {
		return fmt.Errorf("outbox: mark retry: %w", err)
	}
	return nil
}

// Release ends owner's lease on rows it claimed but did not publish (they
// were behind a failed row of their aggregate).
func Release(ctx context.Context, db DBTX, owner string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := db.Exec(ctx, `UPDATE relaybus_outbox SET lease_owner = NULL, lease_expires_at = NULL
		WHERE id = ANY($1) AND lease_owner = $2 AND published_at IS NULL`, ids, owner)
	if err != nil {
		return fmt.Errorf("outbox: release: %w", err)
	}
	return nil
}

// LedgerBehind returns up to limit published rows whose send the ledger has
// not recorded, oldest first, for the relay to record again.
func LedgerBehind(ctx context.Context, db DBTX, limit int) ([]event.Event, error) {
	rows, err := db.Query(ctx, `SELECT id, aggregatetype, aggregateid, event_type, version, payload, occurred_at,
		topic, source, schema_version, payload_type, trace_id, span_id, parent_event_id, correlation_id, initiator, expire_at
		FROM relaybus_outbox WHERE ledger_behind ORDER BY seq LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: ledger behind: %w", err)
	}
	defer rows.Close()
	var out []event.Event
	for rows.Next() {
		var (
			e         event.Event
			initiator []byte
			expire    *time.Time
		)
		if err := rows.Scan(&e.ID, &e.AggregateType, &e.AggregateID, &e.Type, &e.Version, &e.Payload, &e.OccurredAt,
			&e.Topic, &e.Source, &e.SchemaVersion, &e.PayloadType, &e.TraceID, &e.SpanID, &e.ParentEventID,
			&e.CorrelationID, &initiator, &expire); err != nil {
			return nil, fmt.Errorf("outbox: ledger behind: %w", err)
		}
		_ = json.Unmarshal(initiator, &e.Initiator)
		if expire != nil {
			e.ExpireAt = expire.UTC()
		}
		e.OccurredAt = e.OccurredAt.UTC()
		out = append(out, e)
	}
	return out, rows.Err()
}

// LedgerCaughtUp clears the ledger_behind mark of rows the ledger recorded.
func LedgerCaughtUp(ctx context.Context, db DBTX, ids []string) error {
	_, err := db.Exec(ctx, `UPDATE relaybus_outbox SET ledger_behind = false WHERE id = ANY($1)`, ids)
	if err != nil {
		return fmt.Errorf("outbox: ledger caught up: %w", err)
	}
	return nil
}

// Purge deletes up to limit rows published before before and returns how
// many it deleted; call it until it returns less than limit.
func Purge(ctx context.Context, db DBTX, before time.Time, limit int) (int, error) {
	tag, err := db.Exec(ctx, `DELETE FROM relaybus_outbox WHERE id IN (
		SELECT id FROM relaybus_outbox WHERE published_at IS NOT NULL AND published_at < $1 AND NOT ledger_behind
		ORDER BY published_at LIMIT $2)`, before, limit)
	if err != nil {
		return 0, fmt.Errorf("outbox: purge: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Counts is the outbox's backlog.
type Counts struct {
	// Pending rows wait to be published (or to be retried).
	Pending int `json:"pending"`
	// Failed rows gave up and wait for an operator.
	Failed int `json:"failed"`
}

// Count returns the backlog.
func Count(ctx context.Context, db DBTX) (Counts, error) {
	var c Counts
	err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE failed_at IS NULL), count(*) FILTER (WHERE failed_at IS NOT NULL)
		FROM relaybus_outbox WHERE published_at IS NULL`).Scan(&c.Pending, &c.Failed)
	if err != nil {
		return Counts{}, fmt.Errorf("outbox: count: %w", err)
	}
	return c, nil
}
