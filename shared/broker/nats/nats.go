// Package nats is relaybus's NATS JetStream broker driver, the second broker
// beside Pub/Sub (shared/broker/pubsub), chosen by TRANSPORT=nats. It implements
// the broker contract (shared/broker's Broker: single publishes, the relay's
// PublishBatch, Pull for the pull consumer mode, Provision) and two
// capabilities, broker.TimeSeeker ([Client.SeekTime]) and
// broker.SubscriptionAdmin ([Client.CreateSubscription] and
// [Client.DeleteSubscription]: a forwarder's durable consumer made and
// deleted at run time); it keeps no snapshots and has no push.
//
// Mapping (https://docs.nats.io/nats-concepts/jetstream):
//
//   - a topic is a stream named like it with '.' as '_', holding the
//     subjects <topic>.* (one token more: the ordering key), so a topic's
//     <topic>.dlq stream (<topic>.dlq.*) never overlaps it;
//   - the ordering key is the subject's last token ([KeyToken]) and the
//     Relaybus-Ordering-Key header; a stream stores a subject's messages in
//     publish order and a consumer delivers them in stream order;
//   - attributes are headers; on the relay's path (PublishBatch) the
//     event_id attribute is also Nats-Msg-Id, so a run the relay publishes
//     again within the stream's duplicate window (Options.DuplicateWindow)
//     is stored once
//     (https://docs.nats.io/using-nats/developer/develop_jetstream/model_deep_dive#message-deduplication).
//     Single publishes carry none: dead letters of one event from several
//     consumers, its rollup notices and its replays share its event id and
//     must each be stored; nor does a batch message addressed to one
//     consumer (a re-push: topology.TargetConsumerAttr);
//   - a subscription is a durable pull consumer of the topic's stream with
//     explicit acks and the subscription's ack deadline as AckWait; its
//     dead-lettering after max attempts is the pull worker's (JetStream
//     only stops redelivering at MaxDeliver and sends an advisory);
//   - the message id is the stream's name and the stream sequence
//     (MessageID: sequences restart in every stream, and the DLQ archive
//     keys letters by message id), the delivery attempt the
//     consumer's NumDelivered, the publish time the stream's timestamp.
package nats

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// Client is a broker (shared/broker) that can also seek to a time and
// create and delete a subscription at run time.
var (
	_ broker.Broker            = (*Client)(nil)
	_ broker.TimeSeeker        = (*Client)(nil)
	_ broker.SubscriptionAdmin = (*Client)(nil)
)

// HeaderOrderingKey carries a message's ordering key as given (the subject
// carries it as a token).
const HeaderOrderingKey = "Relaybus-Ordering-Key"

// Defaults of Options.
const (
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultPullWait        = 2 * time.Second
	DefaultAckWait         = 60 * time.Second
)

// Options configure a Client.
type Options struct {
	// DuplicateWindow is how long a stream remembers message ids for
	// deduplication (DefaultDuplicateWindow, JetStream's own default).
	DuplicateWindow time.Duration
	// PullWait is how long one Pull waits for messages (DefaultPullWait).
	PullWait time.Duration
	// Name is the connection's name in the server's monitoring.
	Name string
	// CredsFile is a NATS credentials file (a user JWT and its NKey
	// seed, as `nsc` writes it) to authenticate with; empty: none.
	CredsFile string
}

// Client publishes to and pulls from a NATS JetStream server.
type Client struct {
	nc *nats.Conn
	js jetstream.JetStream
	o  Options

	mu        sync.Mutex
	consumers map[string]consumerInfo
}

type consumerInfo struct {
	c     jetstream.Consumer
	topic string
}

// Connect connects to the NATS server at url (NATS_URL), reconnecting
// forever after a lost connection.
func Connect(ctx context.Context, url string, o Options) (*Client, error) {
	if url == "" {
		return nil, errors.New("nats: NATS_URL is empty: want the server's URL, e.g. nats://127.0.0.1:4222")
	}
	if o.DuplicateWindow <= 0 {
		o.DuplicateWindow = DefaultDuplicateWindow
	}
	if o.PullWait <= 0 {
		o.PullWait = DefaultPullWait
	}
	if o.Name == "" {
		o.Name = "relaybus"
	}
	opts := []nats.Option{nats.Name(o.Name), nats.MaxReconnects(-1)}
	if o.CredsFile != "" {
		if _, err := os.Stat(o.CredsFile); err != nil {
			return nil, fmt.Errorf("nats: NATS_CREDS: %w", err)
		}
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("nats: connect to %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats: jetstream on %s: %w", url, err)
	}
	return &Client{nc: nc, js: js, o: o, consumers: map[string]consumerInfo{}}, nil
}

// JetStream returns the underlying JetStream context, for administration.
func (c *Client) JetStream() jetstream.JetStream { return c.js }

// Close drains the connection: what was published is flushed.
func (c *Client) Close() error {
	if err := c.nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		return fmt.Errorf("nats: drain: %w", err)
	}
	return nil
}

// StreamName is the stream holding topic's messages.
func StreamName(topic string) string {
	b := []byte(names.ResourceID(topic))
	for i, ch := range b {
		if ch == '.' {
			b[i] = '_'
		}
	}
	return string(b)
}

// MessageID is the message id of the message stored at seq in stream:
// "<stream>-<seq>", unique on the server as Pub/Sub's are on a topic (a
// sequence alone repeats in every stream: the letters of two DLQ streams
// collided in the archive).
func MessageID(stream string, seq uint64) string {
	return stream + "-" + strconv.FormatUint(seq, 10)
}

// ConsumerName is the durable consumer standing for subscription.
func ConsumerName(subscription string) string { return StreamName(subscription) }

// KeyToken is the subject token of an ordering key: the key itself when it
// is made of letters, digits, '-' and '_', else '~' and its unpadded
// base64url form (an empty key is "~").
func KeyToken(key string) string {
	if key != "" && plain(key) {
		return key
	}
	return "~" + base64.RawURLEncoding.EncodeToString([]byte(key))
}

func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '_') {
			return false
		}
	}
	return true
}

// Subject is the subject a message of topic with ordering key key is
// published to.
func Subject(topic, key string) string { return names.ResourceID(topic) + "." + KeyToken(key) }

// EnsureTopic creates topic's stream if it does not exist (file storage,
// the duplicate window; retention 0 keeps messages until limits).
func (c *Client) EnsureTopic(ctx context.Context, topic string, retention time.Duration) error {
	id := names.ResourceID(topic)
	_, err := c.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: StreamName(id), Subjects: []string{id + ".*"}, Storage: jetstream.FileStorage,
		Duplicates: c.o.DuplicateWindow, MaxAge: retention,
	})
	if err != nil {
		return fmt.Errorf("nats: stream for topic %s: %w", id, err)
	}
	return nil
}

// SubscriptionConfig is a subscription's settings.
type SubscriptionConfig struct {
	// AckWait is the lease of a delivered message (DefaultAckWait).
	AckWait time.Duration
	// MaxAckPending bounds the messages delivered and not yet
	// acknowledged, across every puller of the consumer
	// (DefaultMaxAckPending): the server delivers no more until some are.
	MaxAckPending int
}

// DefaultMaxAckPending is SubscriptionConfig.MaxAckPending's default.
const DefaultMaxAckPending = 10_000

// EnsureSubscription creates the durable pull consumer standing for
// subscription on topic's stream (which must exist).
func (c *Client) EnsureSubscription(ctx context.Context, topic, subscription string, sc SubscriptionConfig) error {
	if sc.AckWait <= 0 {
		sc.AckWait = DefaultAckWait
	}
	if sc.MaxAckPending <= 0 {
		sc.MaxAckPending = DefaultMaxAckPending
	}
	topic = names.ResourceID(topic)
	cfg := jetstream.ConsumerConfig{
		Durable: ConsumerName(subscription), AckPolicy: jetstream.AckExplicitPolicy, AckWait: sc.AckWait,
		DeliverPolicy: jetstream.DeliverAllPolicy, MaxDeliver: -1, MaxAckPending: sc.MaxAckPending,
	}
	// A consumer SeekTime recreated keeps its start: JetStream refuses to
	// change an existing consumer's deliver policy.
	if old, err := c.js.Consumer(ctx, StreamName(topic), cfg.Durable); err == nil {
		if info := old.CachedInfo(); info != nil && info.Config.DeliverPolicy == jetstream.DeliverByStartTimePolicy {
			cfg.DeliverPolicy, cfg.OptStartTime = info.Config.DeliverPolicy, info.Config.OptStartTime
		}
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("nats: consumer for subscription %s: %w", subscription, err)
	}
	cons, err := c.js.CreateOrUpdateConsumer(ctx, StreamName(topic), cfg)
	if err != nil {
		return fmt.Errorf("nats: consumer for subscription %s: %w", subscription, err)
	}
	c.mu.Lock()
	c.consumers[names.ResourceID(subscription)] = consumerInfo{c: cons, topic: topic}
	c.mu.Unlock()
	return nil
}

// SeekTime rewinds subscription's durable consumer to t, as Pub/Sub's
// Seek to a time does: every message the stream stored at or after t is
// delivered again, acknowledged or not, and none stored before it.
//
// JetStream cannot seek a durable consumer in place: an existing
// consumer's deliver policy and start time are not editable
// (https://docs.nats.io/nats-concepts/jetstream/consumers#configuration;
// the server answers "deliver policy can not be updated"), and the
// consumer reset API ($JS.API.CONSUMER.RESET, to a sequence) needs
// nats-server 2.14 (https://github.com/nats-io/nats-server/pull/7489).
// So the consumer is deleted and created again under the same name with
// DeliverByStartTime from t and its other settings unchanged, the way the
// NATS maintainers describe it
// (https://github.com/nats-io/nats.go/discussions/2094): pullers keep
// pulling it by name. What a puller held at that moment cannot be
// acknowledged any more; the new consumer delivers it again when it was
// stored at or after t, and the inbox absorbs what was applied already.
func (c *Client) SeekTime(ctx context.Context, subscription string, t time.Time) error {
	ci, err := c.consumer(ctx, subscription)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return &broker.Error{Kind: broker.ErrNotFound, Reason: "subscription " + names.ResourceID(subscription) + " does not exist (no durable consumer of that name)", Err: err}
	}
	if err != nil {
		return err
	}
	info, err := ci.c.Info(ctx)
	if err != nil {
		return fmt.Errorf("nats: seek %s: %w", subscription, err)
	}
	cfg := info.Config
	t = t.UTC()
	cfg.DeliverPolicy, cfg.OptStartTime, cfg.OptStartSeq = jetstream.DeliverByStartTimePolicy, &t, 0
	stream := StreamName(ci.topic)
	if err := c.js.DeleteConsumer(ctx, stream, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("nats: seek %s: delete the consumer: %w", subscription, err)
	}
	cons, err := c.js.CreateConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("nats: seek %s: create the consumer again (it is gone until provisioned again): %w", subscription, err)
	}
	c.mu.Lock()
	c.consumers[names.ResourceID(subscription)] = consumerInfo{c: cons, topic: ci.topic}
	c.mu.Unlock()
	return nil
}

func (c *Client) consumer(ctx context.Context, subscription string) (consumerInfo, error) {
	id := names.ResourceID(subscription)
	c.mu.Lock()
	ci, ok := c.consumers[id]
	c.mu.Unlock()
	if ok {
		return ci, nil
	}
	topic, _, _, err := names.ParseSubscription(id)
	if err != nil {
		return consumerInfo{}, fmt.Errorf("nats: subscription %s: not ensured by this client and not named <topic>.<consumer>-<role>: %w", id, err)
	}
	cons, err := c.js.Consumer(ctx, StreamName(topic), ConsumerName(id))
	if err != nil {
		return consumerInfo{}, fmt.Errorf("nats: subscription %s: %w", id, err)
	}
	ci = consumerInfo{c: cons, topic: topic}
	c.mu.Lock()
	c.consumers[id] = ci
	c.mu.Unlock()
	return ci, nil
}

// msg builds the NATS message of m on topic, with the event id as its
// Nats-Msg-Id when dedup.
func msg(topic string, m event.Message, dedup bool) *nats.Msg {
	nm := nats.NewMsg(Subject(topic, m.OrderingKey))
	nm.Data = m.Data
	for k, v := range m.Attributes {
		nm.Header.Set(k, v)
	}
	if m.OrderingKey != "" {
		nm.Header.Set(HeaderOrderingKey, m.OrderingKey)
	}
	if id := m.Attributes[event.AttrEventID]; dedup && id != "" {
		nm.Header.Set(jetstream.MsgIDHeader, id)
	}
	return nm
}

// Publish sends m to topic and waits for the stream's acknowledgement; the
// message id is MessageID's. It is never deduplicated (see the
// package doc): the relay publishes with PublishBatch.
func (c *Client) Publish(ctx context.Context, topic string, m event.Message) (string, error) {
	ack, err := c.js.PublishMsg(ctx, msg(topic, m, false))
	if err != nil {
		return "", fmt.Errorf("publish to %s: %w", names.ResourceID(topic), err)
	}
	return MessageID(ack.Stream, ack.Sequence), nil
}

// PublishBatch publishes msgs to topic in order and returns how many the
// stream acknowledged: all, or the prefix before the first failure with its
// error. The messages are sent asynchronously on the one connection, which
// the server reads in order, so a key's messages are stored in order; the
// acknowledgements are then awaited in order. A message after a failed one
// may still have been stored: the relay republishes it, and its
// Nats-Msg-Id (the event id; none for a message addressed to one
// consumer) makes that a duplicate the stream drops.
func (c *Client) PublishBatch(ctx context.Context, topic string, msgs []event.Message) (int, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(msgs))
	var sendErr error
	for _, m := range msgs {
		f, err := c.js.PublishMsgAsync(msg(topic, m, m.Attributes[topology.TargetConsumerAttr] == ""))
		if err != nil {
			sendErr = err
			break
		}
		futures = append(futures, f)
	}
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return i, fmt.Errorf("publish to %s: %w", names.ResourceID(topic), err)
		case <-ctx.Done():
			return i, fmt.Errorf("publish to %s: %w", names.ResourceID(topic), ctx.Err())
		}
	}
	if sendErr != nil {
		return len(futures), fmt.Errorf("publish to %s: %w", names.ResourceID(topic), sendErr)
	}
	return len(futures), nil
}

// Pull returns at most max messages of subscription's consumer as soon as
// there are any, waiting at most the client's PullWait for the first.
//
// It sends one pull request of its own, no_wait with an expiry
// ($JS.API.CONSUMER.MSG.NEXT,
// https://docs.nats.io/reference/jetstream/api/consumer/get-next; batch
// at most 256). nats-server (2.12, processNextMsgRequest) takes that pair
// as a one-shot: it delivers what the consumer holds and ends the request
// at once (404 after a partial batch), waits for the first message when
// it holds none, and ends it at its expiry (408) in every case, also when
// the consumer is at its MaxAckPending. So no request of this Pull is left on
// the server after it returns, to take a message the worker hands back
// or a message nobody reads.
//
// nats.go's Fetch and FetchNoWait could not do this. A fetch of max with a
// wait held what arrived until max had arrived or the wait passed, leased
// on the server with its AckWait running, where the worker could neither
// deliver nor renew it: up to PullWait of latency per message at light
// traffic, and under load a lease that lapsed before the worker saw its
// message, which came back behind its key's next ones. A no-wait fetch
// has no expiry, and at MaxAckPending the server leaves it pending (the
// client gives up on it after a second), so it outlived the Pull.
//
// A Pull whose ctx ends while it waits still waits for the server to end
// its request (PullWait at most), so that nothing of it is left there: a
// worker's graceful drain takes that long more.
//
// When other pulls of the consumer are waiting for more messages than it
// holds, the server refuses a no-wait request at once (408 Requests
// Pending); Pull then waits its turn with an ordinary request for one
// message.
func (c *Client) Pull(ctx context.Context, subscription string, max int) ([]broker.Lease, error) {
	ci, err := c.consumer(ctx, subscription)
	if err != nil {
		return nil, err
	}
	wait := c.o.PullWait
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
		wait = time.Until(dl)
	}
	if wait < time.Millisecond || ctx.Err() != nil {
		return nil, ctx.Err()
	}
	subject := "$JS.API.CONSUMER.MSG.NEXT." + StreamName(ci.topic) + "." + ConsumerName(subscription)
	out, pending, err := c.next(subject, ci.topic, nextRequest{Batch: max, NoWait: true, Expires: wait})
	if err == nil && pending && len(out) == 0 {
		out, _, err = c.next(subject, ci.topic, nextRequest{Batch: 1, Expires: wait})
	}
	if err != nil {
		return out, fmt.Errorf("nats: pull %s: %w", subscription, err)
	}
	return out, nil
}

// nextRequest is a JetStream pull request (JSApiConsumerGetNextRequest).
type nextRequest struct {
	Batch   int           `json:"batch"`
	NoWait  bool          `json:"no_wait,omitempty"`
	Expires time.Duration `json:"expires"`
}

// next sends one pull request to subject and reads its messages until
// the server ends it. pending reports the server's immediate refusal of a
// no-wait request while other requests wait (408 Requests Pending).
func (c *Client) next(subject, topic string, req nextRequest) (out []broker.Lease, pending bool, err error) {
	inbox := c.nc.NewInbox()
	sub, err := c.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	body, err := json.Marshal(req)
	if err != nil {
		return nil, false, err
	}
	if err := c.nc.PublishRequest(subject, inbox, body); err != nil {
		return nil, false, err
	}
	// The server ends the request by its expiry; a second more is for a
	// server that went away.
	deadline := time.Now().Add(req.Expires + time.Second)
	for len(out) < req.Batch {
		m, err := sub.NextMsg(time.Until(deadline))
		if errors.Is(err, nats.ErrTimeout) {
			return out, false, nil
		}
		if err != nil {
			return out, false, err
		}
		if code := m.Header.Get("Status"); code != "" && len(m.Data) == 0 {
			switch code {
			case "404", "408":
				// Ended: no (more) messages, or expired.
				return out, code == "408" && strings.Contains(m.Header.Get("Description"), "Requests Pending"), nil
			case "100":
				continue // a heartbeat
			default:
				return out, false, fmt.Errorf("status %s %s", code, m.Header.Get("Description"))
			}
		}
		out = append(out, lease(m, topic))
	}
	return out, false, nil
}

func lease(nm *nats.Msg, topic string) *natsLease {
	m := event.Message{Data: nm.Data, Topic: topic, Attributes: map[string]string{}}
	for k, vs := range nm.Header {
		if len(vs) == 0 || k == HeaderOrderingKey || k == jetstream.MsgIDHeader {
			continue
		}
		m.Attributes[k] = vs[0]
	}
	m.OrderingKey = nm.Header.Get(HeaderOrderingKey)
	if md, err := nm.Metadata(); err == nil {
		m.ID = MessageID(md.Stream, md.Sequence.Stream)
		m.DeliveryAttempt = int(md.NumDelivered)
		m.PublishTime = md.Timestamp
	}
	return &natsLease{nm: nm, m: m}
}

// natsLease is a message of a pull request: its reply subject is its
// lease on the consumer.
type natsLease struct {
	nm *nats.Msg
	m  event.Message
}

func (l *natsLease) Message() event.Message { return l.m }

// Ack acknowledges and waits for the server's confirmation.
func (l *natsLease) Ack(ctx context.Context) error { return l.nm.AckSync(nats.Context(ctx)) }

func (l *natsLease) Nack(_ context.Context, delay time.Duration) error {
	if delay <= 0 {
		return l.nm.Nak()
	}
	return l.nm.NakWithDelay(delay)
}

// Extend resets the redelivery timer to the consumer's AckWait.
func (l *natsLease) Extend(context.Context) error { return l.nm.InProgress() }
