package telemetry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric names. The first four are the messaging semantic conventions'
// (https://opentelemetry.io/docs/specs/semconv/messaging/messaging-metrics/);
// the rest are relaybus's. Every attribute is low-cardinality: a topic, a
// subscription, a consumer, an outcome, a hop; never an event or aggregate
// id.
const (
	// MetricOperationDuration: seconds of one Pub/Sub publish request of the
	// relay (a run of one aggregate). messaging.system,
	// messaging.destination.name, messaging.operation.name=publish,
	// error.type when it failed.
	MetricOperationDuration = "messaging.client.operation.duration"
	// MetricSentMessages: messages the relay published (Pub/Sub
	// acknowledged them), or failed to (error.type set), per topic.
	MetricSentMessages = "messaging.client.sent.messages"
	// MetricConsumedMessages: deliveries consume handled, per topic,
	// subscription and relaybus.outcome (success, failed, retry, poison,
	// dead_lettered, parked, duplicate, ignored).
	MetricConsumedMessages = "messaging.client.consumed.messages"
	// MetricProcessDuration: seconds consume spent on one delivery
	// (decode, inbox, handler, commit), same attributes.
	MetricProcessDuration = "messaging.process.duration"
	// MetricHopDuration: seconds an event spent on one hop (relaybus.hop):
	// enqueue_to_publish (outbox commit → Pub/Sub acknowledged),
	// publish_to_consume (Pub/Sub publish time → the consumer's commit),
	// end_to_end (occurredAt → the consumer's commit), commit_to_status
	// (the newest consumer commit → the rollup's write of a settled
	// status: CONSUMED, FAILED, EXPIRED).
	MetricHopDuration = "relaybus.hop.duration"
	// MetricPublishRequestDuration: seconds of one HTTP publish request,
	// by http.response.status_code.
	MetricPublishRequestDuration = "relaybus.publish.request.duration"
	// MetricOutboxOldestAge: seconds since the oldest unpublished outbox
	// row was committed, per database (relaybus.database); 0 when none.
	MetricOutboxOldestAge = "relaybus.outbox.oldest_pending.age"
	// MetricOutboxPending: unpublished outbox events, per database and
	// relaybus.state (pending, blocked, failed).
	MetricOutboxPending = "relaybus.outbox.pending"
	// MetricStrictOldestGapAge: seconds the oldest event parked behind an
	// open gap of a strict consumer has waited (relaybus.consumer); 0 when
	// no gap is open.
	MetricStrictOldestGapAge = "relaybus.strict.oldest_gap.age"
	// MetricStrictOpenGaps: a strict consumer's open gaps (aggregates
	// whose next version has not been applied while later ones wait; at
	// most projection.DefaultGapLimit are counted).
	MetricStrictOpenGaps = "relaybus.strict.open_gaps"
	// MetricAggregateIDSource: decoded events by where their aggregate id
	// came from (relaybus.aggregate_id.source: envelope, attribute,
	// ordering_key), per topic.
	MetricAggregateIDSource = "relaybus.aggregate_id.source"
	// MetricAggregateIDInvalid: messages refused for their aggregate id
	// (relaybus.reason: missing_aggregate_id, invalid_aggregate_id), per
	// topic.
	MetricAggregateIDInvalid = "relaybus.aggregate_id.invalid"
	// MetricProjectionVersionLag: the versions a state projection jumped
	// over when it applied an event (the event's version minus the version
	// it held minus 1; 0 when the event was the next one), per topic and
	// consumer. The projection version lag (event version −
	// projection version) as the consumer can measure it: the aggregate's
	// latest version lives in the producer's database, but the event being
	// applied is the newest version the consumer knows of, and the version
	// the projection held is read in the same statement that applies it.
	// A value above 0 means versions were not applied before a newer one:
	// reordered deliveries (no ordering key, Eventarc, a re-push), a
	// dead-lettered or failed version, or a projection started mid-stream.
	MetricProjectionVersionLag = "relaybus.projection.version_lag"
	// MetricProjectionStale: events a state projection did not apply
	// because it already held their version or a newer one (a late
	// delivery of a version it jumped over, a replay), per topic and
	// consumer; a redelivery of the same event is counted by consume as a
	// duplicate instead and never reaches the projection.
	MetricProjectionStale = "relaybus.projection.stale"
	// MetricBreakerTransitions: changes of a forward consumer's circuit
	// breaker (relaybus.consumer), by the state entered (relaybus.state:
	// open, half_open, closed).
	MetricBreakerTransitions = "relaybus.forward.breaker.transitions"
	// MetricBreakerState: a forward consumer's circuit breaker now, per
	// consumer: 0 closed, 1 half-open, 2 open.
	MetricBreakerState = "relaybus.forward.breaker.state"
	// MetricFlowInFlight: a consume instance's deliveries past its
	// flow-control gate and not yet done, per consumer.
	MetricFlowInFlight = "relaybus.consume.flow.in_flight"
	// MetricFlowAtLimit: 1 while a consume instance holds a delivery back
	// for its flow-control limits (one waits, or every slot is taken),
	// else 0, per consumer.
	MetricFlowAtLimit = "relaybus.consume.flow.at_limit"
	// MetricFlowRefused: deliveries a consume instance's flow control
	// refused (429 on push, held on pull), per consumer, since the
	// instance started.
	MetricFlowRefused = "relaybus.consume.flow.refused"
)

// Attribute keys of relaybus's metrics.
const (
	KeyHop      = attribute.Key("relaybus.hop")
	KeyDatabase = attribute.Key("relaybus.database")
	KeyState    = attribute.Key("relaybus.state")
	KeySource   = attribute.Key("relaybus.aggregate_id.source")
	KeyReason   = attribute.Key("relaybus.reason")
	KeyStatus   = attribute.Key("http.response.status_code")
)

// Hops (relaybus.hop).
const (
	HopEnqueueToPublish = "enqueue_to_publish"
	HopPublishToConsume = "publish_to_consume"
	HopEndToEnd         = "end_to_end"
	HopCommitToStatus   = "commit_to_status"
)

// versionBuckets are the version lag's bucket bounds: 0 (in order) apart,
// then the version-lag alert's threshold (10) among a few orders of magnitude.
var versionBuckets = []float64{0, 1, 2, 5, 10, 20, 50, 100, 1000}

// durationBuckets are the semantic conventions' advice for messaging
// durations, extended to the minutes a scheduled drain or a retry takes.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60, 120, 300, 600}

type instruments struct {
	meter                 metric.Meter
	opDuration, process   metric.Float64Histogram
	hop, publishRequest   metric.Float64Histogram
	sent, consumed        metric.Int64Counter
	aggSource, aggInvalid metric.Int64Counter
	versionLag            metric.Int64Histogram
	stale                 metric.Int64Counter
	breaker               metric.Int64Counter

	mu   sync.RWMutex
	sets map[setKey]*opts
}

// opts are one attribute set's options, as the slices the instruments'
// variadic methods take (built once: a slice made at each call would be
// allocated at each call).
type opts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newInstruments(m metric.Meter) *instruments {
	h := func(name, desc string) metric.Float64Histogram {
		i, _ := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(durationBuckets...))
		return i
	}
	c := func(name, desc string) metric.Int64Counter {
		i, _ := m.Int64Counter(name, metric.WithUnit("{message}"), metric.WithDescription(desc))
		return i
	}
	versionLag, _ := m.Int64Histogram(MetricProjectionVersionLag, metric.WithUnit("{version}"),
		metric.WithDescription("Versions a state projection jumped over when it applied an event."),
		metric.WithExplicitBucketBoundaries(versionBuckets...))
	stale, _ := m.Int64Counter(MetricProjectionStale, metric.WithUnit("{event}"),
		metric.WithDescription("Events a state projection did not apply: it held their version or a newer one."))
	breaker, _ := m.Int64Counter(MetricBreakerTransitions, metric.WithUnit("{transition}"),
		metric.WithDescription("Changes of a forward consumer's circuit breaker, by the state entered."))
	return &instruments{
		meter:          m,
		breaker:        breaker,
		versionLag:     versionLag,
		stale:          stale,
		sets:           map[setKey]*opts{},
		opDuration:     h(MetricOperationDuration, "Duration of a Pub/Sub publish request of the relay."),
		process:        h(MetricProcessDuration, "Duration of consume's processing of one delivery."),
		hop:            h(MetricHopDuration, "Time an event spent on one hop of its way."),
		publishRequest: h(MetricPublishRequestDuration, "Duration of one HTTP publish request."),
		sent:           c(MetricSentMessages, "Messages the relay published to Pub/Sub (error.type: failed)."),
		consumed:       c(MetricConsumedMessages, "Deliveries consume handled, by outcome."),
		aggSource:      c(MetricAggregateIDSource, "Decoded events by where their aggregate id came from."),
		aggInvalid:     c(MetricAggregateIDInvalid, "Messages refused for a missing or invalid aggregate id."),
	}
}

// setKey names one attribute set; sets are built once and cached (a map
// under a read lock: a sync.Map would box the key on every lookup), so a
// measurement allocates nothing.
type setKey struct {
	kind       uint8
	a, b, c, d string
	status     int
}

func (in *instruments) set(k setKey, build func() []attribute.KeyValue) *opts {
	in.mu.RLock()
	o, ok := in.sets[k]
	in.mu.RUnlock()
	if ok {
		return o
	}
	m := metric.WithAttributeSet(attribute.NewSet(build()...))
	o = &opts{add: []metric.AddOption{m}, rec: []metric.RecordOption{m}}
	in.mu.Lock()
	in.sets[k] = o
	in.mu.Unlock()
	return o
}

func errorType(err error) string {
	if err == nil {
		return ""
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return "timeout"
	}
	return "publish_error"
}

// RecordPublish records one Pub/Sub publish request of the relay to topic:
// its duration, and sent messages acknowledged and failed more not.
func RecordPublish(ctx context.Context, topic string, sent, failed int, d time.Duration, err error) {
	st := current.Load()
	if st == nil {
		return
	}
	in := st.inst
	et := errorType(err)
	o := in.set(setKey{kind: 1, a: topic, b: et}, func() []attribute.KeyValue {
		kv := []attribute.KeyValue{KeySystem.String(SystemPubSub), KeyDestination.String(topic), KeyOperationName.String("publish"), KeyOperationType.String("send")}
		if et != "" {
			kv = append(kv, KeyErrorType.String(et))
		}
		return kv
	})
	in.opDuration.Record(ctx, d.Seconds(), o.rec...)
	if sent > 0 {
		in.sent.Add(ctx, int64(sent), in.set(setKey{kind: 2, a: topic}, func() []attribute.KeyValue {
			return []attribute.KeyValue{KeySystem.String(SystemPubSub), KeyDestination.String(topic), KeyOperationName.String("publish")}
		}).add...)
	}
	if failed > 0 {
		in.sent.Add(ctx, int64(failed), in.set(setKey{kind: 3, a: topic, b: et}, func() []attribute.KeyValue {
			return []attribute.KeyValue{KeySystem.String(SystemPubSub), KeyDestination.String(topic), KeyOperationName.String("publish"), KeyErrorType.String(et)}
		}).add...)
	}
}

// RecordConsume records one delivery consume handled: the consumed
// message and its processing time, by outcome.
func RecordConsume(ctx context.Context, topic, subscription, consumer, outcome string, d time.Duration) {
	st := current.Load()
	if st == nil {
		return
	}
	in := st.inst
	o := in.set(setKey{kind: 4, a: topic, b: subscription, c: consumer, d: outcome}, func() []attribute.KeyValue {
		return []attribute.KeyValue{KeySystem.String(SystemPubSub), KeyDestination.String(topic), KeySubscription.String(subscription),
			KeyOperationName.String("process"), KeyConsumer.String(consumer), KeyOutcome.String(outcome)}
	})
	in.consumed.Add(ctx, 1, o.add...)
	in.process.Record(ctx, d.Seconds(), o.rec...)
}

// RecordHop records the time one event spent on hop (Hop*), for topic and,
// on the consumer's side, consumer. A negative duration (clocks apart) is
// recorded as 0.
func RecordHop(ctx context.Context, hop, topic, consumer string, d time.Duration) {
	st := current.Load()
	if st == nil {
		return
	}
	if d < 0 {
		d = 0
	}
	in := st.inst
	in.hop.Record(ctx, d.Seconds(), in.set(setKey{kind: 5, a: hop, b: topic, c: consumer}, func() []attribute.KeyValue {
		kv := []attribute.KeyValue{KeyHop.String(hop), KeyDestination.String(topic)}
		if consumer != "" {
			kv = append(kv, KeyConsumer.String(consumer))
		}
		return kv
	}).rec...)
}

// RecordPublishRequest records one HTTP publish request's duration and
// status.
func RecordPublishRequest(ctx context.Context, status int, d time.Duration) {
	st := current.Load()
	if st == nil {
		return
	}
	in := st.inst
	in.publishRequest.Record(ctx, d.Seconds(), in.set(setKey{kind: 6, status: status}, func() []attribute.KeyValue {
		return []attribute.KeyValue{KeyStatus.Int(status)}
	}).rec...)
}

// RecordAggregateID counts a decoded event's aggregate id source (from:
// envelope, attribute, ordering_key) or, with reason set
// (missing_aggregate_id, invalid_aggregate_id), a refused message.
func RecordAggregateID(ctx context.Context, topic, from, reason string) {
	st := current.Load()
	if st == nil {
		return
	}
	in := st.inst
	if reason != "" {
		in.aggInvalid.Add(ctx, 1, in.set(setKey{kind: 7, a: topic, b: reason}, func() []attribute.KeyValue {
			return []attribute.KeyValue{KeyDestination.String(topic), KeyReason.String(reason)}
		}).add...)
		return
	}
	if from == "" {
		return
	}
	in.aggSource.Add(ctx, 1, in.set(setKey{kind: 8, a: topic, b: from}, func() []attribute.KeyValue {
		return []attribute.KeyValue{KeyDestination.String(topic), KeySource.String(from)}
	}).add...)
}

// RecordProjection records a state projection's handling of an event of
// version for consumer on topic: applied over held (the version the
// projection held before, 0 when none), the versions it jumped over
// (version - held - 1) into relaybus.projection.version_lag; not applied
// (it held version or a newer one), a relaybus.projection.stale event.
func RecordProjection(ctx context.Context, topic, consumer string, version, held int64, applied bool) {
	st := current.Load()
	if st == nil {
		return
	}
	in := st.inst
	o := in.set(setKey{kind: 9, a: topic, b: consumer}, func() []attribute.KeyValue {
		return []attribute.KeyValue{KeyDestination.String(topic), KeyConsumer.String(consumer)}
	})
	if !applied {
		in.stale.Add(ctx, 1, o.add...)
		return
	}
	lag := version - held - 1
	if lag < 0 {
		lag = 0
	}
	in.versionLag.Record(ctx, lag, o.rec...)
}

// OutboxBacklog is one outbox database's backlog as the gauges report it.
type OutboxBacklog struct {
	// OldestAge is how long ago the oldest unpublished row committed (0
	// when none).
	OldestAge time.Duration
	// Pending, Blocked and Failed count unpublished events by state.
	Pending, Blocked, Failed int
}

// ObserveOutbox registers the outbox gauges of database (a name for the
// relaybus.database attribute): read is called at each collection; when
// it fails the gauges are left out of that collection (and the error
// handed to OpenTelemetry's error handler), never the other metrics. It
// returns the function that unregisters them; with telemetry off it does
// nothing.
func ObserveOutbox(database string, read func(ctx context.Context) (OutboxBacklog, error)) (unregister func() error) {
	st := current.Load()
	if st == nil {
		return func() error { return nil }
	}
	m := st.inst.meter
	oldest, err1 := m.Float64ObservableGauge(MetricOutboxOldestAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unpublished outbox row."))
	pending, err2 := m.Int64ObservableGauge(MetricOutboxPending, metric.WithUnit("{event}"),
		metric.WithDescription("Unpublished outbox events by state."))
	if err1 != nil || err2 != nil {
		return func() error { return nil }
	}
	db := KeyDatabase.String(database)
	sets := map[string]metric.ObserveOption{}
	for _, s := range []string{"pending", "blocked", "failed"} {
		sets[s] = metric.WithAttributes(db, KeyState.String(s))
	}
	at := metric.WithAttributes(db)
	reg, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		b, err := read(ctx)
		if err != nil {
			// Not returned: the SDK drops a whole collection, every
			// other metric with it, when a callback fails.
			otel.Handle(fmt.Errorf("telemetry: outbox gauges of %s: %w", database, err))
			return nil
		}
		o.ObserveFloat64(oldest, b.OldestAge.Seconds(), at)
		o.ObserveInt64(pending, int64(b.Pending), sets["pending"])
		o.ObserveInt64(pending, int64(b.Blocked), sets["blocked"])
		o.ObserveInt64(pending, int64(b.Failed), sets["failed"])
		return nil
	}, oldest, pending)
	if err != nil {
		return func() error { return nil }
	}
	return reg.Unregister
}

// ObserveGaps registers a strict consumer's gap gauges: read returns the
// age of the oldest parked event behind an open gap (0 when none) and the
// number of open gaps, and is called at each collection. It returns the
// function that unregisters them; with telemetry off it does nothing.
func ObserveGaps(consumer string, read func(ctx context.Context) (oldest time.Duration, open int, err error)) (unregister func() error) {
	st := current.Load()
	if st == nil {
		return func() error { return nil }
	}
	m := st.inst.meter
	age, err1 := m.Float64ObservableGauge(MetricStrictOldestGapAge, metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest event parked behind an open gap of a strict consumer."))
	gaps, err2 := m.Int64ObservableGauge(MetricStrictOpenGaps, metric.WithUnit("{gap}"),
		metric.WithDescription("Open gaps of a strict consumer."))
	if err1 != nil || err2 != nil {
		return func() error { return nil }
	}
	at := metric.WithAttributes(KeyConsumer.String(consumer))
	reg, err := m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		oldest, open, err := read(ctx)
		if err != nil {
			// Not returned: the SDK drops a whole collection when a
			// callback fails.
			otel.Handle(fmt.Errorf("telemetry: gap gauges of %s: %w", consumer, err))
			return nil
		}
		o.ObserveFloat64(age, oldest.Seconds(), at)
		o.ObserveInt64(gaps, int64(open), at)
		return nil
	}, age, gaps)
	if err != nil {
		return func() error { return nil }
	}
	return reg.Unregister
}

// RecordBreaker counts a change of consumer's circuit breaker from one
// state to another (the forward handler's breaker: closed, half_open,
// open).
func RecordBreaker(ctx context.Context, consumer, from, to string) {
	st := current.Load()
	if st == nil {
		return
	}
	o := st.inst.set(setKey{kind: 10, a: consumer, b: to}, func() []attribute.KeyValue {
		return []attribute.KeyValue{KeyConsumer.String(consumer), KeyState.String(to)}
	})
	st.inst.breaker.Add(ctx, 1, o.add...)
}

// ObserveBreaker registers consumer's breaker-state gauge: read returns 0
// (closed), 1 (half-open) or 2 (open) at each collection. It returns the
// function that unregisters it; with telemetry off it does nothing.
func ObserveBreaker(consumer string, read func() int64) (unregister func() error) {
	st := current.Load()
	if st == nil {
		return func() error { return nil }
	}
	m := st.inst.meter
	g, err := m.Int64ObservableGauge(MetricBreakerState, metric.WithUnit("{state}"),
		metric.WithDescription("A forward consumer's circuit breaker: 0 closed, 1 half-open, 2 open."))
	if err != nil {
		return func() error { return nil }
	}
	at := metric.WithAttributes(KeyConsumer.String(consumer))
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(g, read(), at)
		return nil
	}, g)
	if err != nil {
		return func() error { return nil }
	}
	return reg.Unregister
}

// ObserveFlow registers consumer's flow-control gauges and counter
// (MetricFlowInFlight, MetricFlowAtLimit, MetricFlowRefused): read
// returns the deliveries in flight, whether the gate holds one back, and
// the refusals so far, at each collection. It returns the function that
// unregisters them; with telemetry off it does nothing.
func ObserveFlow(consumer string, read func() (inFlight int64, atLimit bool, refused int64)) (unregister func() error) {
	st := current.Load()
	if st == nil {
		return func() error { return nil }
	}
	m := st.inst.meter
	inFlight, err1 := m.Int64ObservableGauge(MetricFlowInFlight, metric.WithUnit("{delivery}"),
		metric.WithDescription("A consume instance's deliveries past its flow-control gate and not yet done."))
	atLimit, err2 := m.Int64ObservableGauge(MetricFlowAtLimit, metric.WithUnit("1"),
		metric.WithDescription("1 while a consume instance holds a delivery back for its flow-control limits."))
	refused, err3 := m.Int64ObservableCounter(MetricFlowRefused, metric.WithUnit("{delivery}"),
		metric.WithDescription("Deliveries a consume instance's flow control refused (429 on push, held on pull)."))
	if err1 != nil || err2 != nil || err3 != nil {
		return func() error { return nil }
	}
	at := metric.WithAttributes(KeyConsumer.String(consumer))
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		n, limited, r := read()
		o.ObserveInt64(inFlight, n, at)
		var l int64
		if limited {
			l = 1
		}
		o.ObserveInt64(atLimit, l, at)
		o.ObserveInt64(refused, r, at)
		return nil
	}, inFlight, atLimit, refused)
	if err != nil {
		return func() error { return nil }
	}
	return reg.Unregister
}
