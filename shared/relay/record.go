package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/pack"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

// recordedRun is one settled run on its way to the ledger: its sends, and
// the ledger cursor move they make.
type recordedRun struct {
	outbox.Recorded
	sends []model.Sent
}

// recordSends records a batch of settled runs' sends in the ledger (one
// RecordSent, within LedgerBudget) and moves their aggregates' ledger
// cursors. A failure leaves the cursors: the healing step records those
// sends later (RecordSent is idempotent).
func (r *Relay) recordSends(ctx context.Context, runs []recordedRun) {
	var sends []model.Sent
	for _, run := range runs {
		sends = append(sends, run.sends...)
	}
	lctx, cancel := context.WithTimeout(ctx, r.o.LedgerBudget)
	defer cancel()
	if err := r.o.Ledger.RecordSent(lctx, sends); err != nil {
		r.log.WarnContext(ctx, "relay: the ledger did not record sends; the healing step records them later",
			"events", len(sends), "error", err.Error())
		return
	}
	marks := make([]outbox.Recorded, len(runs))
	for i, run := range runs {
		marks[i] = run.Recorded
	}
	if !r.marks.Add(marks...) {
		r.markRecorded(ctx, marks) // full or closing: mark them now
	}
}

// markWait is how long the ledger cursor moves of recorded runs gather
// before one statement writes them: at most a second, and well inside
// HealDelay (the healing step takes an aggregate only HealDelay after its
// send, so it almost never records one whose move is on its way; if it
// does, RecordSent is idempotent). A statement per ledger batch was a
// transaction per event or two under a steady load.
func markWait(healDelay time.Duration) time.Duration {
	return min(time.Second, healDelay/5)
}

// markRecorded moves the ledger cursors of recorded runs, in one statement
// per round: an aggregate's runs are merged where each starts at the end
// of the one before it (they arrive in order), and a run that does not
// follow on waits for the next round. A failure leaves the cursors: the
// healing step records those sends again.
func (r *Relay) markRecorded(ctx context.Context, marks []outbox.Recorded) {
	ctx, cancel := context.WithTimeout(ctx, r.o.LedgerBudget)
	defer cancel()
	for _, round := range mergeRecorded(marks) {
		if err := outbox.LedgerRecorded(ctx, r.o.DB, r.dbNow(), r.o.HealDelay, round); err != nil {
			r.log.WarnContext(ctx, "relay: cannot mark sends recorded; the healing step records them again", "error", err.Error())
			return
		}
	}
}

// mergeRecorded folds consecutive cursor moves of one aggregate into one
// (From..To then To..To2 is From..To2) and puts a move that does not follow
// on from its aggregate's last into a later round, so no statement moves
// one aggregate twice (an UPDATE ... FROM applies one of them only).
func mergeRecorded(marks []outbox.Recorded) [][]outbox.Recorded {
	var rounds [][]outbox.Recorded
	at := map[outbox.Aggregate][2]int{} // aggregate -> round, index of its last move
	for _, m := range marks {
		if p, ok := at[m.Aggregate]; ok {
			last := &rounds[p[0]][p[1]]
			if last.To == m.From {
				last.To = m.To
				continue
			}
			k := p[0] + 1
			if k == len(rounds) {
				rounds = append(rounds, nil)
			}
			rounds[k] = append(rounds[k], m)
			at[m.Aggregate] = [2]int{k, len(rounds[k]) - 1}
			continue
		}
		if len(rounds) == 0 {
			rounds = append(rounds, nil)
		}
		rounds[0] = append(rounds[0], m)
		at[m.Aggregate] = [2]int{0, len(rounds[0]) - 1}
	}
	return rounds
}

// failureRecord is one publish failure on its way to the ledger.
type failureRecord struct {
	e        *event.Event
	attempts int
	err      string
	final    bool
	at       time.Time
}

// recordFailures records publish failures in the ledger (PENDING while
// retrying, FAILED when final), within LedgerBudget. One that is lost is
// only a missing detail: the outbox keeps the failure and the status.
func (r *Relay) recordFailures(ctx context.Context, fs []failureRecord) {
	ctx, cancel := context.WithTimeout(ctx, r.o.LedgerBudget)
	defer cancel()
	for _, f := range fs {
		if err := r.o.Ledger.RecordPublishFailure(ctx, f.e, f.attempts, f.err, f.final, f.at); err != nil {
			r.log.WarnContext(ctx, "relay: the ledger did not record a publish failure", append(logging.Event(f.e), "error", err.Error())...)
		}
	}
}

// Healing: how many aggregates one claim of unrecorded sends takes, and
// how many rows of each.
const (
	healAggregates = 100
	healRunLimit   = 500
)

// heal records in the ledger the sends the live recorder missed, until
// nothing is due or ctx ends, and returns how many it recorded.
func (r *Relay) heal(ctx context.Context) (int, error) {
	healed := 0
	for ctx.Err() == nil {
		us, err := outbox.ClaimUnrecorded(ctx, r.o.DB, r.dbNow(), healAggregates, r.o.LedgerBudget+r.o.HealDelay, healRunLimit)
		if err != nil || len(us) == 0 {
			return healed, err
		}
		now := time.Now().UTC()
		var sends []model.Sent
		marks := make([]outbox.Recorded, 0, len(us))
		for _, u := range us {
			for _, row := range u.Rows {
				e := row.Event
				sends = append(sends, model.Sent{Event: &e, EnqueuedAt: row.EnqueuedAt, At: now})
			}
			marks = append(marks, u.Recorded())
		}
		lctx, cancel := context.WithTimeout(ctx, r.o.LedgerBudget)
		err = r.o.Ledger.RecordSent(lctx, sends)
		if err == nil {
			err = outbox.LedgerRecorded(lctx, r.o.DB, r.dbNow(), r.o.HealDelay, marks)
		}
		cancel()
		if err != nil {
			return healed, err
		}
		healed += len(sends)
	}
	return healed, nil
}

// repushBatch bounds one claim of re-pushes: a broker request's worth
// (the Pub/Sub driver sends up to 1,000 messages a request).
const repushBatch = 1000

// repushes publishes the queued re-pushes of published events until none
// is due or ctx ends, and returns how many went out. A claim's re-pushes
// of one topic go out together, in the order they were queued, as one
// PublishBatch (each message keeps its own ordering key and target
// consumer): a backfill's events travel a request per topic and claim,
// not one each. A batch the broker refuses is published again a key at a
// time (see publishRepushes), so one message it rejects fails only the
// re-pushes of its key from it on, which keep their order for the retry.
func (r *Relay) repushes(ctx context.Context) (int, error) {
	done := 0
	for ctx.Err() == nil {
		qs, err := outbox.ClaimRepushes(ctx, r.o.DB, r.dbNow(), r.o.Lease, repushBatch)
		if err != nil || len(qs) == 0 {
			return done, err
		}
		outcomes := make([]outbox.RepushOutcome, len(qs))
		fail := func(i int, err error) {
			q := qs[i]
			n := q.Attempts + 1
			o := &outcomes[i]
			o.Error, o.Final = err.Error(), n >= r.o.MaxAttempts
			o.RetryAt = r.now().Add(r.retryAfter(n))
			e := q.Row.Event
			r.log.WarnContext(ctx, "relay: re-push failed", append(logging.Event(&e), "attempts", n, "final", o.Final, "error", o.Error)...)
			if r.failures != nil {
				r.failures.Add(failureRecord{e: &e, attempts: n, err: o.Error, final: o.Final, at: time.Now().UTC()})
			}
		}
		var topics []string
		byTopic := map[string][]int{} // topic -> indexes into qs, in claim order
		for i, q := range qs {
			outcomes[i].ID = q.ID
			if !q.Found {
				outcomes[i].Error, outcomes[i].Final = "the event is no longer in the outbox (retention deleted it)", true
				continue
			}
			t := q.Row.Event.Topic
			if _, ok := byTopic[t]; !ok {
				topics = append(topics, t)
			}
			byTopic[t] = append(byTopic[t], i)
		}
		// The claim is published whole, within its lease, even when ctx
		// (the drain's budget) ends meanwhile: a re-push failed by the
		// budget would be retried after a backoff, behind the later
		// versions of its aggregate that the next claims publish.
		pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.Lease-r.o.LeaseMargin)
		var sends []model.Sent
		for _, t := range topics {
			for _, i := range r.publishRepushes(pctx, t, qs, byTopic[t], fail) {
				outcomes[i].Published = true
				e := qs[i].Row.Event
				sends = append(sends, model.Sent{Event: &e, EnqueuedAt: qs[i].Row.EnqueuedAt, At: time.Now().UTC()})
				done++
			}
		}
		pcancel()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		err = outbox.SettleRepushes(sctx, r.o.DB, r.dbNow(), outcomes)
		cancel()
		if err != nil {
			return done, err
		}
		if r.o.Ledger != nil && len(sends) > 0 {
			// The event's document exists (it was sent before); RecordSent
			// leaves it as it is and creates it if retention removed it.
			lctx, cancel := context.WithTimeout(ctx, r.o.LedgerBudget)
			if err := r.o.Ledger.RecordSent(lctx, sends); err != nil {
				r.log.WarnContext(ctx, "relay: the ledger did not record re-pushed sends", "events", len(sends), "error", err.Error())
			}
			cancel()
		}
	}
	return done, nil
}

// publishRepushes publishes the re-pushes qs[idx] of topic, in order, and
// returns the indexes the broker acknowledged; fail records each other
// one's failure. A re-push whose message cannot be made (encoding, claim
// check) fails alone. The rest go as one PublishBatch, runs of one
// aggregate addressed to one consumer as packs (Options.MaxPack); when the
// broker acknowledges only part of it, what it did not is published again
// one ordering key at a time, a key's messages stopping at their first
// failure, so a message the broker rejects holds back its own key only and
// no key's re-pushes reach the broker out of their queued order.
func (r *Relay) publishRepushes(ctx context.Context, topic string, qs []outbox.QueuedRepush, idx []int, fail func(int, error)) []int {
	var (
		msgs []event.Message
		rows []outbox.Row
		ok   []int // indexes of msgs
	)
	for _, i := range idx {
		m, err := r.encode(&qs[i].Row)
		if err == nil && r.o.Claims != nil {
			m, err = r.o.Claims.Offload(ctx, topic, m)
		}
		if err != nil {
			fail(i, err)
			continue
		}
		row := qs[i].Row
		row.EnqueuedAt = time.Time{} // a re-push is not a hop of the event's first way
		msgs, rows, ok = append(msgs, m), append(rows, row), append(ok, i)
	}
	if len(msgs) == 0 {
		return nil
	}
	units, members := r.packs(topic, msgs)
	urows := make([]outbox.Row, len(units))
	for u, ms := range members {
		urows[u] = rows[ms[0]]
	}
	n, err := r.publish(ctx, topic, units, urows)
	if err == nil && n < len(units) {
		err = fmt.Errorf("publish to %s: the broker acknowledged %d of %d messages", topic, n, len(units))
	}
	var published []int
	for _, ms := range members[:n] {
		for _, k := range ms {
			published = append(published, ok[k])
		}
	}
	if err == nil {
		return published
	}
	// Again a key at a time: the keys in the order of their first message.
	var keys []string
	byKey := map[string][]int{} // ordering key -> positions in units
	for u := n; u < len(units); u++ {
		key := units[u].OrderingKey
		if _, seen := byKey[key]; !seen {
			keys = append(keys, key)
		}
		byKey[key] = append(byKey[key], u)
	}
	for _, key := range keys {
		us := byKey[key]
		kmsgs, krows := make([]event.Message, len(us)), make([]outbox.Row, len(us))
		for j, u := range us {
			kmsgs[j], krows[j] = units[u], urows[u]
		}
		kn, kerr := 0, err // past the lease's margin, no more keys are tried
		if ctx.Err() == nil {
			kn, kerr = r.publish(ctx, topic, kmsgs, krows)
			if kerr == nil && kn < len(us) {
				kerr = fmt.Errorf("publish to %s: the broker acknowledged %d of %d messages", topic, kn, len(us))
			}
		}
		for j, u := range us {
			for _, k := range members[u] {
				if j < kn {
					published = append(published, ok[k])
				} else {
					fail(ok[k], kerr)
				}
			}
		}
	}
	return published
}

// packs returns the messages that carry msgs to topic, in order: each run
// of consecutive messages of one ordering key addressed to one consumer
// that takes packs, within Options.MaxPack and pack.MaxBytes, as one pack,
// every other message alone; members[u] are the positions in msgs that
// units[u] carries.
func (r *Relay) packs(topic string, msgs []event.Message) (units []event.Message, members [][]int) {
	flush := func(from, to int) {
		if to-from > 1 {
			if p, err := pack.Encode(msgs[from:to]); err == nil {
				// A forced trace of the re-push (an operator's) goes on
				// with the pack.
				if tp := msgs[from].Attributes[telemetry.AttrTraceparent]; tp != "" {
					p.Attributes[telemetry.AttrTraceparent] = tp
				}
				units = append(units, p)
				members = append(members, seq(from, to))
				return
			}
			// Unreachable: the run shares its key and target and is
			// within the bounds; alone, each still goes out.
		}
		for k := from; k < to; k++ {
			units, members = append(units, msgs[k]), append(members, []int{k})
		}
	}
	packable := map[string]bool{}
	from, size := 0, 0
	for k, m := range msgs {
		first := msgs[from]
		target := m.Attributes[topology.TargetConsumerAttr]
		p, seen := packable[target]
		if !seen {
			p = r.packable(topic, target)
			packable[target] = p
		}
		if k > from && (!p || m.OrderingKey != first.OrderingKey || target != first.Attributes[topology.TargetConsumerAttr] ||
			k-from >= r.o.MaxPack || size+pack.Size(m) > pack.MaxBytes) {
			flush(from, k)
			from, size = k, 0
		}
		size += pack.Size(m)
	}
	flush(from, len(msgs))
	return units, members
}

// packable says whether re-pushes to topic addressed to target may travel
// in packs: only to a consumer the Topology declares on topic that reads
// them as a consume engine applying events in its own transaction, so
// not to one
//   - with an extra filter, which reads each event's attributes, which a
//     pack does not carry;
//   - on Eventarc, whose deliveries carry no delivery attempt for the
//     engine to tell a pack's last delivery by;
//   - forwarding (handler forward, or a forwarder added at run time, which
//     the Topology does not know): each event is a call of its own to the
//     target, and a pack's calls in one delivery would outlast the ack
//     deadline the forward timeout is kept within;
//
// and not on a topic with a schema, whose broker validates each message's
// data against it.
func (r *Relay) packable(topic, target string) bool {
	if target == "" || r.o.MaxPack < 2 || r.o.Topology == nil {
		return false
	}
	if t := r.o.Topology.Topic(topic); t == nil || len(t.Schemas) > 0 {
		return false
	}
	declared := false
	for _, c := range r.o.Topology.Consumers() {
		if c.Topic == topic && c.Service == target { // each of its roles' subscriptions takes the re-push
			if c.ExtraFilter != "" || c.Delivery == topology.DeliveryEventarc || c.Handler == topology.HandlerForward {
				return false
			}
			declared = true
		}
	}
	return declared
}

// seq is from, from+1, ..., to-1.
func seq(from, to int) []int {
	s := make([]int, 0, to-from)
	for k := from; k < to; k++ {
		s = append(s, k)
	}
	return s
}
