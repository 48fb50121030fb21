// Package inbox is the consumer side's deduplication and attempt log in
// Postgres: a row per (consumer, event) written in the same transaction as
// the handler's effect, so an event applied once is never applied again,
// however often Pub/Sub, Eventarc, a replay or a re-push delivers it; each
// consumer's attempts at an event numbered monotonically across
// redeliveries; and every attempt (relaybus_attempts) committed with its
// outcome, which makes Postgres the truth of what was consumed. The ledger
// (Firestore) gets the attempts after the fact: each attempt is queued in
// relaybus_inbox_unshipped when it is recorded, Unshipped reads the queue
// and Shipped empties it (by the queue rows' tuple ids where it has them:
// the queue has no index).
//
// An attempt's number is the next after the highest the consumer has used
// for the event: the inbox row's (a claim, an application) and the
// recorded attempts' (every numbered attempt is recorded, a failed one
// after its rollback). Both are read through primary keys, so numbering
// writes nothing of its own.
//
// An attempt runs in one transaction:
//
//	BEGIN
//	BeginApplied  number the attempt, claim the event (or find it applied)
//	              and record and queue the attempt as a success, one
//	              statement
//	handler       the consumer's effect and child events
//	(Outcome      a handler that parked the event: the outcome corrected)
//	COMMIT
//	  or, when the handler failed:
//	ROLLBACK      the effect, the claim and the record go
//	Record        number 0: number again and record the failed attempt,
//	              one statement (its own transaction)
//
// so the claim, the effect and the attempt commit together, in a single
// commit, with one statement of the inbox's and no savepoint (a
// subtransaction on every delivery to serve only the rare failure). A
// failed attempt costs one more transaction, and a delivery of the same
// event that waited on the inbox row may take its number first: the failed
// attempt then takes the next one (Record tries again with a fresh
// snapshot). An attempt's consumed_at is when it began.
//
// A handler may settle other events in that transaction (a strict
// consumer's resequencer applies the parked events whose turn has come):
// Next locks such an event's inbox row and numbers an attempt at it, and
// Settle records it, with the inbox row following its outcome (see
// settle.sql).
//
// # Claims: a remote call outside the transaction
//
// A handler whose effect is a call to another service (shared/forward) must
// not hold a Postgres connection while the other service takes its time,
// so its attempt has three steps and the inbox row has a state:
//
//	Claim       number the attempt; insert the row 'claimed' with a lease -> COMMIT
//	            (an 'applied' row: a duplicate; a claim still leased: busy)
//	call        the handler, no transaction open
//	Delivered   success: 'claimed' -> 'applied' + the attempt, one statement
//	  or Failed failure: the row deleted + the attempt, one statement
//	  or Release held back (the target down, its breaker open): the row
//	            deleted, nothing recorded; the next claim takes the number
//
//	            claimed --success--> applied
//	               |  \--failure--> (no row: a redelivery claims again)
//	               \--lease ran out (the process died)--> taken over by the
//	                   next delivery: claimed again, the old attempt recorded
//	                   as retry "abandoned", the call made again
//
// The effect is never lost: until an outcome is recorded the claim stands,
// the delivery was not acknowledged, and Pub/Sub redelivers; once its lease
// has run out the redelivery calls again. It is recorded once: only the
// attempt holding the claim records a success, and an applied row makes
// every later delivery a duplicate. The call itself can happen twice (the
// process died after the call and before Delivered), so the other service
// must be idempotent on the event id (shared/forward sends it as Ce-Id and
// Idempotency-Key). Rows written in the handler's own transaction are
// 'applied' from the start.
//
// Every query is a .sql file under sql/, embedded.
package inbox

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/shared/postgres"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrations is the inbox's migration line.
var Migrations = migrate.MustLoadFS("inbox", migrationFS, "migrations")

//go:embed sql/*.sql
var sqlFS embed.FS

func query(name string) string {
	b, err := sqlFS.ReadFile("sql/" + name + ".sql")
	if err != nil {
		panic("inbox: no query " + name)
	}
	return string(b)
}

var (
	beginSQL     = query("begin")
	lockSQL      = query("lock")
	appliedSQL   = query("begin_applied")
	outcomeSQL   = query("outcome")
	recordSQL    = query("record")
	failedSQL    = query("failed")
	unshippedSQL = query("unshipped")
	shippedSQL   = query("shipped")
	shippedByKey = query("shipped_keys")
	purgeSQL     = query("purge")
	nextSQL      = query("next")
	settleSQL    = query("settle")
	claimSQL     = query("claim")
	claimedSQL   = query("claimstate")
	deliveredSQL = query("delivered")
	lookupSQL    = query("lookup")
	releaseSQL   = query("release")
)

// Migrate creates or upgrades the inbox tables in db's search_path.
func Migrate(ctx context.Context, db migrate.Beginner) error {
	_, err := Migrations.Apply(ctx, db)
	return err
}

// ErrNumberTaken is BeginApplied's error when a concurrent attempt at the
// same event that failed recorded itself under the number this one took
// while it waited on the event's inbox row: the caller rolls back and asks
// for a redelivery, which takes the next number.
var ErrNumberTaken = errors.New("inbox: a concurrent attempt took this attempt's number")

// Begun is what Begin found.
type Begun struct {
	// Attempt is this attempt's number.
	Attempt int
	// Claimed is false when another delivery applied the event already (the
	// caller rolls back and acknowledges); Applied is then that delivery's
	// attempt number (0 when not known).
	Claimed bool
	Applied int
	// Queued is the attempt's row in the unshipped queue (BeginApplied,
	// when it recorded the attempt): set it on the Attempt that is
	// shipped, so Shipped finds the row by its tuple id.
	Queued pgtype.TID
}

// Begin numbers one more attempt of consumer at eventID and claims the
// event in the inbox, in tx (the attempt's transaction), in one statement.
// A concurrent delivery of the same event waits here until tx ends.
func Begin(ctx context.Context, tx postgres.DBTX, consumer, eventID string) (Begun, error) {
	var b Begun
	var attempt, applied *int
	if err := tx.QueryRow(ctx, beginSQL, consumer, eventID).Scan(&attempt, &b.Claimed, &applied); err != nil {
		return Begun{}, fmt.Errorf("inbox: begin attempt: %w", err)
	}
	if attempt != nil {
		b.Attempt = *attempt
	}
	if !b.Claimed && applied != nil {
		b.Applied = *applied
	}
	return b, nil
}

// BeginApplied is Begin for an attempt whose handler runs in tx: when it
// claims the event it also records the attempt (a's delivery facts and
// ConsumedAt, outcome success) in the same statement, so a success
// commits with no statement of its own. A handler that parks the event
// corrects the outcome with Outcome; a failure rolls the record back with
// everything else. a's ConsumerID and EventID name the event; its number
// and outcome are ignored. It returns ErrNumberTaken (wrapped) when a
// concurrent failed attempt took the number first. When a concurrent
// delivery applied the event while the statement waited for it, nothing
// is claimed (Applied 0) and tx is left aborted: the caller rolls it back,
// as it does whenever nothing is claimed.
func BeginApplied(ctx context.Context, tx postgres.DBTX, a Attempt) (Begun, error) {
	b, err := scanApplied(tx.QueryRow(ctx, appliedSQL, a.ConsumerID, a.EventID, a.ConsumedAt, a.Topic, a.Subscription,
		a.MessageID, a.DeliveryAttempt), a.EventID)
	if appliedConcurrently(err) {
		return Begun{}, nil
	}
	return b, err
}

// BeginAppliedAll runs BeginApplied for each of as, in order, in tx, the
// statements sent together in one round trip (a pack's events, applied in
// one transaction), and returns what each began. Each event is then
// claimed before the handler of any runs: only for events whose handlers
// do not ask whether the others are applied. An attempt's event that
// a concurrent delivery's transaction claimed and committed while the
// statements ran fails the whole batch (the inbox's primary key): the
// caller rolls tx back and takes the events one at a time.
func BeginAppliedAll(ctx context.Context, tx pgx.Tx, as []Attempt) ([]Begun, error) {
	var batch pgx.Batch
	for _, a := range as {
		batch.Queue(appliedSQL, a.ConsumerID, a.EventID, a.ConsumedAt, a.Topic, a.Subscription, a.MessageID, a.DeliveryAttempt)
	}
	res := tx.SendBatch(ctx, &batch)
	out := make([]Begun, len(as))
	for i, a := range as {
		b, err := scanApplied(res.QueryRow(), a.EventID)
		if err != nil {
			_ = res.Close()
			return nil, err
		}
		out[i] = b
	}
	if err := res.Close(); err != nil {
		return nil, beginErr(err, "")
	}
	return out, nil
}

// Beginner begins a transaction whose first statement goes out with its
// BEGIN, in one round trip (a *pgpool.Pool).
type Beginner interface {
	BeginWith(ctx context.Context, dest []any, sql string, args ...any) (pgx.Tx, error)
}

// BeginAppliedIn begins the attempt's transaction on db and runs
// BeginApplied in it, the statement sent with the BEGIN in one round trip
// when db is a Beginner. It returns the open transaction (nil with an
// error); a failed BeginApplied rolls it back.
func BeginAppliedIn(ctx context.Context, db interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}, a Attempt) (pgx.Tx, Begun, error) {
	p, ok := db.(Beginner)
	if !ok {
		tx, err := db.Begin(ctx)
		if err != nil {
			return nil, Begun{}, fmt.Errorf("inbox: begin: %w", err)
		}
		b, err := BeginApplied(ctx, tx, a)
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return nil, Begun{}, err
		}
		return tx, b, nil
	}
	var b Begun
	var attempt, applied *int
	var recorded bool
	tx, err := p.BeginWith(ctx, []any{&attempt, &b.Claimed, &applied, &recorded, &b.Queued}, appliedSQL, a.ConsumerID, a.EventID,
		a.ConsumedAt, a.Topic, a.Subscription, a.MessageID, a.DeliveryAttempt)
	if appliedConcurrently(err) {
		// BeginWith rolled its transaction back; the caller gets one to
		// roll back, as after any delivery that claimed nothing.
		fresh, err := db.Begin(ctx)
		if err != nil {
			return nil, Begun{}, fmt.Errorf("inbox: begin: %w", err)
		}
		return fresh, Begun{}, nil
	}
	if err != nil {
		return nil, Begun{}, beginErr(err, a.EventID)
	}
	b, err = begun(b, attempt, applied, recorded, a.EventID)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, Begun{}, err
	}
	return tx, b, nil
}

// beginErr is begin_applied.sql's error: the attempts' primary key taken
// under this attempt's number is a concurrent failed attempt that recorded
// itself under it while the statement waited on the inbox row
// (ErrNumberTaken).
func beginErr(err error, eventID string) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "23505" && pg.ConstraintName == "relaybus_attempts_pkey" {
		return fmt.Errorf("inbox: begin attempt at %s: %w", eventID, ErrNumberTaken)
	}
	return fmt.Errorf("inbox: begin attempt: %w", err)
}

// appliedConcurrently says whether err is begin_applied.sql's insert of
// the inbox row failing on its primary key: a delivery of the same event
// whose transaction had not committed when the statement's snapshot was
// taken inserted the row, and committed while the statement waited for it.
// The event is applied by that delivery (its number unknown here), which
// is what ON CONFLICT DO NOTHING answered, without the confirmation record
// a speculative insert writes on every delivery.
func appliedConcurrently(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "23505" && pg.ConstraintName == "relaybus_inbox_pkey"
}

// scanApplied reads begin_applied.sql's row for eventID. A failed
// statement's error is wrapped (beginErr), so appliedConcurrently still
// recognises it.
func scanApplied(row pgx.Row, eventID string) (Begun, error) {
	var b Begun
	var attempt, applied *int
	var recorded bool
	if err := row.Scan(&attempt, &b.Claimed, &applied, &recorded, &b.Queued); err != nil {
		return Begun{}, beginErr(err, eventID)
	}
	return begun(b, attempt, applied, recorded, eventID)
}

// begun completes what begin_applied.sql returned.
func begun(b Begun, attempt, applied *int, recorded bool, eventID string) (Begun, error) {
	if attempt != nil {
		b.Attempt = *attempt
	}
	if b.Claimed && !recorded {
		return Begun{}, fmt.Errorf("inbox: begin attempt %d at %s: %w", b.Attempt, eventID, ErrNumberTaken)
	}
	if !b.Claimed && applied != nil {
		b.Applied = *applied
	}
	return b, nil
}

// Outcome corrects, in tx, the outcome, error code and message of attempt
// a that BeginApplied recorded as a success.
func Outcome(ctx context.Context, tx postgres.DBTX, a Attempt) error {
	if _, err := tx.Exec(ctx, outcomeSQL, a.ConsumerID, a.EventID, a.AttemptNo, a.Outcome, a.ErrorCode, a.ErrorMessage); err != nil {
		return fmt.Errorf("inbox: record the attempt's outcome: %w", err)
	}
	return nil
}

// Attempt is one consumption attempt as Postgres records it.
type Attempt struct {
	ConsumerID string
	EventID    string
	// AttemptNo is the attempt's number; Record with 0 takes the next one.
	AttemptNo int
	// Outcome is the ledger's outcome name (success, retry, failed,
	// poison, dead_lettered).
	Outcome      string
	ErrorCode    string
	ErrorMessage string
	ConsumedAt   time.Time
	// The delivery's facts.
	Topic, Subscription, MessageID string
	DeliveryAttempt                int
	// Queued is the attempt's row in the unshipped queue, when known
	// (Begun.Queued, Unshipped): Shipped deletes it by its tuple id, and
	// an attempt without one by its key, which reads the whole queue.
	Queued pgtype.TID
}

func (a *Attempt) args() []any {
	return []any{a.ConsumerID, a.EventID, a.AttemptNo, a.Outcome, a.ErrorCode, a.ErrorMessage, a.ConsumedAt,
		a.Topic, a.Subscription, a.MessageID, a.DeliveryAttempt}
}

// Record writes an attempt through db (the attempt's transaction for a
// success, or the pool for an attempt outside any: then AttemptNo 0 takes
// the next number in the same statement) and queues it for the ledger. It
// returns the attempt's number, or 0 when that attempt was recorded
// already. A number 0 that a concurrent attempt took first is taken again,
// in a statement with a fresh snapshot, up to recordTries times.
func Record(ctx context.Context, db postgres.DBTX, a Attempt) (int, error) {
	for range recordTries {
		var n int
		err := db.QueryRow(ctx, recordSQL, a.args()...).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) {
			if a.AttemptNo == 0 {
				continue
			}
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("inbox: record attempt: %w", err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("inbox: record attempt at %s: %w", a.EventID, ErrNumberTaken)
}

// recordTries bounds Record's tries at a number 0: each lost try means
// another attempt at the same event recorded itself in between.
const recordTries = 10

// Failed releases the inbox claim of a failed attempt that claimed the
// event with Claim and records it, in one statement (a claim another
// attempt has taken over stays).
func Failed(ctx context.Context, tx postgres.DBTX, a Attempt) error {
	if _, err := tx.Exec(ctx, failedSQL, a.args()...); err != nil {
		return fmt.Errorf("inbox: record failed attempt: %w", err)
	}
	return nil
}

// Release gives up a claim whose call was not an attempt (a Gate held it
// back after the call: shared/forward's breaker found the target down):
// the claim goes and nothing is recorded, so the next claim of the event
// takes the same attempt number. A claim another attempt has taken over
// stays.
func Release(ctx context.Context, db postgres.DBTX, consumer, eventID string, attempt int) error {
	if _, err := db.Exec(ctx, releaseSQL, consumer, eventID, attempt); err != nil {
		return fmt.Errorf("inbox: release claim: %w", err)
	}
	return nil
}

// Unshipped returns up to limit attempts the ledger does not have (the
// unshipped queue) that were made before before (of consumer, or of every
// consumer of the database when consumer is empty), their queue rows
// locked in tx until it ends, so that two shipping steps never ship the
// same attempts.
func Unshipped(ctx context.Context, tx postgres.DBTX, consumer string, before time.Time, limit int) ([]Attempt, error) {
	rows, err := tx.Query(ctx, unshippedSQL, before, limit, consumer)
	if err != nil {
		return nil, fmt.Errorf("inbox: unshipped attempts: %w", err)
	}
	defer rows.Close()
	var out []Attempt
	for rows.Next() {
		var a Attempt
		if err := rows.Scan(&a.ConsumerID, &a.EventID, &a.AttemptNo, &a.Outcome, &a.ErrorCode, &a.ErrorMessage,
			&a.ConsumedAt, &a.Topic, &a.Subscription, &a.MessageID, &a.DeliveryAttempt, &a.Queued); err != nil {
			return nil, fmt.Errorf("inbox: unshipped attempts: %w", err)
		}
		a.ConsumedAt = a.ConsumedAt.UTC()
		out = append(out, a)
	}
	return out, rows.Err()
}

// Shipped marks attempts as held by the ledger (they leave the unshipped
// queue): those whose queue rows' tuple ids it has (Attempt.Queued) in one
// statement, the others by their keys in a second one (the queue has no
// index: that one reads the queue).
func Shipped(ctx context.Context, db postgres.DBTX, as []Attempt) error {
	var byID, byKey shippedBatch
	for _, a := range as {
		if a.Queued.Valid {
			byID.add(a)
		} else {
			byKey.add(a)
		}
	}
	if len(byID.events) > 0 {
		if _, err := db.Exec(ctx, shippedSQL, byID.consumers, byID.events, byID.numbers, byID.tids); err != nil {
			return fmt.Errorf("inbox: mark attempts shipped: %w", err)
		}
	}
	if len(byKey.events) > 0 {
		if _, err := db.Exec(ctx, shippedByKey, byKey.consumers, byKey.events, byKey.numbers); err != nil {
			return fmt.Errorf("inbox: mark attempts shipped: %w", err)
		}
	}
	return nil
}

// shippedBatch is Shipped's arguments as arrays.
type shippedBatch struct {
	consumers, events []string
	numbers           []int32
	tids              []pgtype.TID
}

func (b *shippedBatch) add(a Attempt) {
	b.consumers = append(b.consumers, a.ConsumerID)
	b.events = append(b.events, a.EventID)
	b.numbers = append(b.numbers, int32(a.AttemptNo))
	b.tids = append(b.tids, a.Queued)
}

// Purge deletes up to limit rows older than before from each of the inbox
// and the attempts the ledger has (keep them longer than the
// subscription's message retention, so a redelivery still finds its inbox
// row) and returns how many rows it deleted in all.
func Purge(ctx context.Context, db postgres.DBTX, before time.Time, limit int) (int, error) {
	var a, b int
	if err := db.QueryRow(ctx, purgeSQL, before, limit).Scan(&a, &b); err != nil {
		return 0, fmt.Errorf("inbox: purge: %w", err)
	}
	return a + b, nil
}

// Next numbers one more attempt of consumer at eventID, an event the
// consumer already holds (a parked event its handler applies in another
// event's transaction), in tx, and returns the attempt's number: it locks
// the event's inbox row until tx ends, then reads the highest number used
// (two statements, so the second sees what a transaction it waited on
// committed). Record the attempt with Settle in the same transaction.
func Next(ctx context.Context, tx postgres.DBTX, consumer, eventID string) (int, error) {
	if _, err := tx.Exec(ctx, lockSQL, consumer, eventID); err != nil {
		return 0, fmt.Errorf("inbox: number attempt: %w", err)
	}
	var n int
	if err := tx.QueryRow(ctx, nextSQL, consumer, eventID).Scan(&n); err != nil {
		return 0, fmt.Errorf("inbox: number attempt: %w", err)
	}
	return n, nil
}

// Settle records attempt a at an event the consumer already holds in its
// inbox (claimed by an earlier attempt: a parked event) and brings the
// inbox row in line: success makes it name a (the attempt that applied the
// event); a final failure (failed, poison, dead_lettered) deletes it, so a
// replay or a re-push can apply the event; other outcomes leave it.
// AttemptNo 0 takes the event's next number (Next). The attempt is queued
// for the ledger with it. It returns the attempt's number, or 0 when that
// attempt was recorded already.
func Settle(ctx context.Context, tx postgres.DBTX, a Attempt) (int, error) {
	if a.AttemptNo == 0 {
		n, err := Next(ctx, tx, a.ConsumerID, a.EventID)
		if err != nil {
			return 0, err
		}
		a.AttemptNo = n
	}
	var n int
	err := tx.QueryRow(ctx, settleSQL, a.args()...).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("inbox: settle attempt: %w", err)
	}
	return n, nil
}

// Claim states.
const (
	// StateClaimed: a remote call is (or was) under way; see Claim.
	StateClaimed = "claimed"
	// StateApplied: the event's effect is done.
	StateApplied = "applied"
)

// Claimed is what Claim found.
type Claimed struct {
	// Attempt is this attempt's number (when Claimed).
	Attempt int
	// Claimed: this attempt holds the claim and makes the call.
	Claimed bool
	// Abandoned is the number of the attempt whose expired claim this one
	// took over (0 when the claim was new): that attempt's process stopped
	// between its claim and its record, so whether its call reached the
	// other side is unknown.
	Abandoned int
	// When not Claimed: State is StateApplied (a duplicate; Applied is the
	// attempt that applied it) or StateClaimed (another attempt holds a
	// live claim until LeaseUntil), or "" (a concurrent claim has not
	// committed yet: treat it as busy).
	State      string
	Applied    int
	LeaseUntil time.Time
}

// Claim claims eventID for consumer before a remote call, in a transaction
// of its own that it commits (see the package documentation): the attempt
// is numbered and the row claimed for lease, or an expired claim taken
// over. When the event is applied already or another attempt holds a live
// claim, nothing is written and Claimed is false.
func Claim(ctx context.Context, db migrate.Beginner, consumer, eventID string, lease time.Duration) (Claimed, error) {
	var c Claimed
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var attempt, abandoned *int
		if err := tx.QueryRow(ctx, claimSQL, consumer, eventID, lease.Milliseconds()).Scan(&attempt, &c.Claimed, &abandoned); err != nil {
			return err
		}
		if c.Claimed {
			c.Attempt = *attempt
			if abandoned != nil {
				c.Abandoned = *abandoned
			}
			return nil
		}
		var lu *time.Time
		err := tx.QueryRow(ctx, claimedSQL, consumer, eventID).Scan(&c.State, &c.Applied, &lu)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if lu != nil {
			c.LeaseUntil = lu.UTC()
		}
		c.Attempt = 0
		return errNotClaimed // roll back (nothing was written)
	})
	if errors.Is(err, errNotClaimed) {
		return c, nil
	}
	if err != nil {
		return Claimed{}, fmt.Errorf("inbox: claim: %w", err)
	}
	return c, nil
}

var errNotClaimed = errors.New("not claimed")

// Delivered records the success of a claimed attempt: the claim becomes
// applied and the attempt is recorded, in one statement, if a still holds
// the claim. It reports false when it did not (the lease ran out and
// another attempt took the claim over: that one records its outcome).
func Delivered(ctx context.Context, db postgres.DBTX, a Attempt) (bool, error) {
	var n int
	err := db.QueryRow(ctx, deliveredSQL, a.args()...).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("inbox: record delivered attempt: %w", err)
	}
	return true, nil
}

// Lookup reports whether consumer's inbox holds eventID, and the attempt
// that holds it. Readers outside the consume path (dlqreplay's dry runs)
// go through it rather than reading the table.
func Lookup(ctx context.Context, db postgres.DBTX, consumer, eventID string) (attempt int, ok bool, err error) {
	err = db.QueryRow(ctx, lookupSQL, consumer, eventID).Scan(&attempt)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("inbox: lookup: %w", err)
	}
	return attempt, true, nil
}
