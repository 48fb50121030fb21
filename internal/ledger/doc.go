// Package ledger is relaybus's event ledger on Firestore: every event with its
// envelope, sender and expected consumers (collection events), the consumers
// registered per topic (topic_consumers), every consumption attempt
// (event_consumptions, insert-only), and archived dead letters
// (dead_letters, added by the operations API's dead-letter archive).
//
// # Packages
//
// The ledger's code is split by job:
//
//   - internal/ledger (this package): the write path, the hot one: [Store]
//     records sends and publish failures, folds and rolls up consumers'
//     attempts, reconciles and expires events, and records re-pushes;
//     [Recorder] is consume's side.
//   - internal/ledger/query: the console's and the CLI's reads (List,
//     Search, Get, Trace, Events, the overview's counts and hops).
//   - internal/ledger/consumers: the topic_consumers registry (the deploy's
//     sync, the registry.Registry the relay asks, the console's edits).
//   - internal/ledger/model: the documents' types, statuses and their
//     derivation, levels, notices and ids (no Firestore).
//   - internal/ledger/audit: the operators' audit log.
//   - internal/ledger/internal/fsdoc: what the three Firestore packages share
//     (query shapes and their fields, reads of events and attempts).
//
// # Collections
//
// events/{EventDocID(eventId)}: one document per event ([Event]): the
// envelope as produced (eventId, eventType, source, topic, aggregateType,
// aggregateId, version, occurredAt, schemaVersion, payloadType, payload,
// traceId, spanId, parentEventId, correlationId, initiator{service,
// operation, userId, clientRequestId}, expireAt), the send state (status,
// statusAt, retryCount, sentAt, lastSentAt, createdAt, updatedAt), the
// consumers it was sent to (expectedConsumers), and the bookkeeping the
// status and the indexes need (shard, expireDue, repush, publishFailure).
// Payloads over the store's MaxStoredPayload (900 KiB by default; documents
// hold 1 MiB) are not kept: payloadOmitted is set and payloadSize says how
// big it was.
//
// topic_consumers/{ConsumerDocID(topic, consumerId)}: topic, consumerId,
// enabled, sortOrder, description, createdAt, updatedAt. The document id
// makes (topic, consumerId) unique. consumers.Registry.SyncConsumers makes the
// collection match the topology (infra/topology.yaml via
// registry.Consumers); `go run ./functions/rollup/cmd sync-consumers` runs
// it as a deploy step. consumers.Registry.ExpectedConsumers implements
// registry.Registry over it.
//
// events/{EventDocID(eventId)}/event_consumptions/{AttemptDocID(eventId,
// consumerId, attemptNo)}: one document per attempt ([Attempt]) of a
// consumer that did not succeed at once (at [LevelFull], every attempt):
// eventId, consumerId, attemptNo, success, outcome, errorCode,
// errorMessage, consumedAt, createdAt and the delivery facts. Insert-only.
// A consumer's first attempt that succeeded is kept in its event's
// document instead (Event.Latest, folded in by the rollup) and read back
// as the attempt it was, so every attempt is shown either way; a ledger
// written before the fold (every attempt a document) is read as it is. The attempts of an event are a subcollection of its document
// (the collection group event_consumptions holds them all), so rollup's
// transaction reads and locks one event's attempts and nothing else; an
// attempt may be written before its event's document exists. There is no attempt-0
// placeholder row: the expected consumers are on the event, so "expected vs
// reported" (the console's "1/2 consumed") is expectedConsumers against the
// consumers with attempts (query.Reader.Get, query.Detail.Summary).
//
// Every document id is deterministic, so every write can be repeated: a
// replayed RecordSent creates nothing new and a re-recorded attempt hits
// its own document.
//
// # Who writes what
//
// The ledger records, it does not gate. Postgres is the truth of delivery:
// the outbox (and its per-aggregate dispatch cursor) says what was
// published, the consumer's inbox and its attempts (relaybus_attempts,
// committed in the delivery's own transaction) say what was consumed.
// Every ledger write comes after the fact, in the background, in batches,
// and can be repeated from Postgres; nothing on the delivery path waits on
// Firestore.
//
//   - relay: [Store.RecordSent] after Pub/Sub acknowledged a batch (creates
//     the event, status SENT, expected consumers from the registry,
//     enqueuedAt, checkAt and deleteAt; an existing document that records a
//     send is left exactly as it is), [Store.RecordPublishFailure] when
//     publishing fails (PENDING while retrying, FAILED when it gives up).
//     The outbox's ledger cursor says which sends the ledger has; the
//     relay's healing step records the rest.
//   - consume: nothing in Firestore. [Recorder.RecordAttempts] publishes
//     rollup notices that carry every attempt of a batch ([FoldMessage]);
//     the inbox's unshipped queue says which attempts are not; POST
//     /ledger:ship ships the rest. The sends of the child events it
//     kicks go to the rollup as sends notices too ([SendNotifier]), so a
//     consumer's identity needs no grant on the ledger.
//   - rollup (functions/rollup): [Store.RecordSent] for sends notices;
//     [Store.Fold] inserts the notices' attempts that their topic's
//     [Level] keeps as documents, then folds
//     the notices' attempts into their events' documents and derives statuses ([Store.RollupMany]
//     for notices without attempts); it is the only writer of
//     consumption-derived statuses. An event whose send is not recorded
//     yet gets its document from the fold (topic, expected consumers,
//     outcomes, status; [model.StubEvent]), which the send completes: the
//     fold never waits for the relay's recorder. [Store.Reconcile]
//     derives again every event that is not settled once its checkAt has
//     passed, so a lost notice, or an attempt that reached the ledger before
//     its event's send, still ends in the right status; [Store.ExpireDue]
//     expires events nobody reports on.
//   - operations API: [Store.BeginRepush] when an operator re-pushes.
//   - deploy: consumers.Registry.SyncConsumers.
//
// Every write is idempotent (deterministic document ids, creates that
// leave existing documents alone, statuses derived from facts), so any of
// them can be replayed after a crash, an outage or a lost message, and the
// ledger converges: the relay's healing step and consume's shipping step
// replay what Postgres says the ledger is missing, and the reconciler
// replays the rollup.
//
// # Lifecycle
//
// Every event and attempt document carries deleteAt (its creation +
// Options.Retention, 30 days by default): Firestore's TTL policies on
// events.deleteAt and event_consumptions.deleteAt (infra/terraform)
// delete them after that, typically within a day. The archive's dead
// letters carry their own deleteAt.
//
// # Status truth table
//
// The status is derived ([Derive]) from the event's expected consumers (the
// list it was sent with: consumers added to or disabled in the registry
// later do not change it; attempts by consumers that were not expected are
// shown but do not count), the latest attempt (highest attemptNo) of each,
// expireAt, whether the relay has recorded a send, its latest publish
// failure and the latest re-push. The first rule that holds wins:
//
//  1. CONSUMED: there is at least one expected consumer and every expected
//     consumer's latest attempt succeeded.
//  2. EXPIRED: expireAt is set and has passed.
//  3. PENDING or FAILED: the relay has never recorded a send and no expected
//     consumer has reported: FAILED if the relay gave up publishing
//     (final publish failure), else PENDING.
//  4. RETRYING: a re-push is outstanding: it addressed an expected consumer
//     (one consumer, or all expected ones) that has not succeeded and has
//     made no attempt numbered above the one it had reached when the
//     re-push began, and the relay has not given up publishing it.
//  5. Some expected consumer's latest attempt failed: PARTIAL if some
//     expected consumer's latest attempt succeeded; else RETRYING if some
//     failure will be retried (outcome retry: Pub/Sub redelivers); else
//     FAILED (failed, poison, dead_lettered, stalled).
//  6. SENT: no failures; some expected consumer has not reported yet, or
//     its latest attempt is parked (or the event has no expected
//     consumers).
//
// Outcomes by the rules above: success succeeds; retry is a failure that
// will be retried; failed, poison, dead_lettered and stalled are failures
// nothing retries automatically; parked is neither: a strict consumer
// received the event before its predecessor and holds it in its own
// database (it counts as reported, so rule 3 does not apply, and as no
// failure). A parked event is applied in the transaction that applies its
// predecessor, with a success attempt of its own, so its status moves on
// from SENT without a redelivery. If the predecessor stays missing past the
// consumer's gap timeout, the consumer records a stalled attempt for every
// event it holds behind the gap (rule 5: FAILED, or PARTIAL next to a
// consumer that succeeded) until an operator replays or skips the missing
// version; then their success attempts make them CONSUMED.
//
// Statuses are facts derived again on every rollup, not a one-way machine:
// a late success turns FAILED or PARTIAL into CONSUMED, and a consumer that
// succeeded after its event expired makes it CONSUMED. Re-push
// ([Store.BeginRepush]) sets RETRYING at once (rule 4 then holds it), adds
// one to retryCount and sets lastSentAt. A failure to publish an event that
// was already sent does not change its status (it is kept in
// publishFailure); a final one settles an outstanding re-push.
//
// EXPIRED for events nobody reports on: rollup notices only come with
// attempts, so [Store.ExpireDue] sweeps the expiry index (shard, expireDue)
// for open events whose expireAt has passed and rolls each up. expireDue
// equals expireAt while the event is open and is deleted when it becomes
// CONSUMED or EXPIRED, so the index holds only events the sweep may still
// have to expire. The rollup function serves the sweep at POST /expire for
// a Cloud Scheduler job (every few minutes is plenty).
//
// # Rollup
//
// [Store.Fold] reads the events' documents in one request (one read per
// event), folds each consumer's reported attempt into the document's
// Latest marks when it is newer than the mark there, derives each status
// and writes the marks that moved and the status in one update per event,
// conditioned on the document's update time, through one BulkWriter: no
// transaction, so attempt inserts never wait on a rollup's locks, and a
// write whose document changed in between (another rollup, a send, a
// re-push) is read and folded again. It reads no attempt: the notices
// carry them. The rollup function holds an event until every consumer its
// topic expects has reported (at most its window), so an event's
// consumers cost one fold, and writes an event's document no sooner than
// a second after its last write (the gap; Firestore sustains about one
// write per second per document).
//
// A notice that names events without attempts (the shape before the fold)
// is rolled up as [Store.RollupMany] does: the attempts numbered after
// each consumer's mark are read by document id (attemptWindow per
// consumer), no query (the Firestore emulator answers a query by scanning
// its whole store). The reconciler reads the same windows; it reads an
// event's attempts whole (a query) only when a window comes back full, the
// document predates the fold, or the event has been open ten times
// ReconcileAfter, so an attempt a window cannot reach is still found.
//
// checkAt is present while an event's status is not settled (CONSUMED,
// EXPIRED, FAILED): ReconcileAfter after the last status change, then
// further out at each look the reconciler takes (as long as the event has
// existed, at most an hour), and removed once the status settles, so the
// reconciler's index holds only events it may have to look at.
//
// # Queries
//
//   - query.Reader.List: events newest first (occurredAt desc, then document id)
//     filtered by any combination of status, topic, initiator service and
//     an occurredAt range, or by trace id (the other filters then apply to
//     the trace's events as they are read), in pages of up to 500 with
//     opaque page tokens bound to their filters. Payloads are not read.
//   - query.Reader.Get: one event with every attempt grouped by consumer,
//     expected consumers first, with expected/reported/succeeded counts.
//   - query.Reader.Trace: the events of an event's trace as a tree (parent to
//     children by parentEventId, siblings by occurredAt; at most
//     MaxTraceScan events).
//
// Every query is built from a query shape (QueryShapes in
// internal/ledger/internal/fsdoc); the composite
// indexes they need are declared in infra/firestore/indexes.yaml (which
// Terraform reads), and a test checks the file against the shapes both
// ways, because the emulator needs no indexes and would never tell.
//
// # Cost per event
//
// Reads and writes as Firestore bills them (a query that returns nothing is
// one read). With N expected consumers, the happy path (sent, each consumer
// succeeds at its first attempt, their notices reach one fold) costs, at
// the default [LevelFailures]:
//
//	writes: 2    the event's create when sent; one fold with every outcome
//	reads:  1    the fold reads the event's document
//
// whatever N ([LevelFull]: N + 2 writes, every attempt a document), plus
// the registry lookup (one query per topic per 30 s per instance, cached).
// Each attempt of a consumer that did not succeed at once adds one write
// (its document); a fold that comes after the final status (a consumer
// slower than the rollup's window, a replay) adds one read and one write.
// A re-push costs 1 + k reads and one write; a reconciler look at an event
// that is still waiting 1 + k reads and one write. Before the fold the
// happy path cost N + 2 writes and 2N + 1 reads.
//
// # Scale
//
// Firestore limits writes to a collection with an index on a monotonically
// increasing field (timestamps) to about 500 per second: new entries all
// land at one end of one key range. The ledger exempts every timestamp
// (occurredAt, expireAt, expireDue, checkAt, statusAt, sentAt, lastSentAt,
// enqueuedAt, createdAt, updatedAt, consumedAt, deleteAt) from
// single-field indexing, along with the payload and fields no query filters
// on (infra/firestore/indexes.yaml, exemptions). The timestamps that are
// queried, occurredAt, expireDue and checkAt, and the aggregate id (which
// may grow with time) appear only in composite indexes whose first field
// is shard (a hash of the event id modulo Options.Shards, [DefaultShards]
// = 20), which splits each such index into as many key ranges (500 new
// entries per second each at 10,000 events/s); queries ask for
// `shard in [0..MaxShards-1]` and Firestore merges the ranges in order.
// The trace index starts with the trace id, which is random (W3C). The
// folded marks (latest) are exempt as a map: its subfields inherit it.
//
// Document ids are spread the same way: [EventDocID] puts four hex digits
// of a hash before the event id, so producers' time-ordered ids (UUIDv7,
// ULIDs, sequences) do not make a hot key range, and attempts sit under
// their event's document. event_consumptions needs no index at all (an
// event's attempts are read as its subcollection); its eventId and
// messageId are exempt because they may increase monotonically.
//
// Firestore sustains about one write per second to a single document. No
// ledger document is written often: an event is written when sent and once
// with its consumers' outcomes folded in, a second or more later (more
// only for retries, failures and re-pushes); attempts are written once;
// topic_consumers only by sync. The ledger keeps no counters
// or aggregates in documents; totals per status come from queries, and
// rates from the logs (rollup logs every status change with the event's
// fields and previous_status, for log-based metrics). Rollup writes only on change, so N consumers finishing at once
// cost one status write, and their concurrent transactions touch one
// document for milliseconds. Attempt inserts that wait too long for a
// rollup's locks are answered ABORTED and retried.
//
// # Levels
//
// A topic's [Level] (infra/topology.yaml, ledger:) decides what the ledger
// keeps of its events: [LevelFailures] (the default), [LevelFull],
// [LevelOff]. docs/ledger.md's "Levels and cost" has the arithmetic. (The Firestore emulator
// locks a whole collection for a query in a transaction; with attempts in
// one top-level collection, every rollup would stall every attempt insert
// in local runs. As subcollections, a rollup stalls only its own event's.) RecordSent,
// InsertAttempts and RollupMany write through BulkWriters, which ramp up their
// rate as Firestore asks (500/50/5).
package ledger
