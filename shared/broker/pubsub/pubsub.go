// Package pubsub is relaybus's Pub/Sub broker driver over
// cloud.google.com/go/pubsub/v2: one publisher per topic, message ordering
// always on (the ordering key is the aggregate id), and the paused-key
// handling that ordering requires.
//
// With ordering on, a failed publish pauses its ordering key in the client:
// every later message with that key fails at once with ErrPublishingPaused
// until ResumePublish is called. [Client.PublishAsync] leaves the resume to the
// caller (the relay resumes a key after it has recorded the failure, so that
// nothing behind the failed head slips out of order); [Client.Publish] resumes
// the key itself before it returns the error.
//
// Client is a broker (shared/broker's Broker) with the capabilities
// broker.TimeSeeker, broker.Snapshotter and broker.PushConfigurer, over
// Pub/Sub's subscription admin API (admin.go).
package pubsub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/event"
)

// Client is a broker (shared/broker) that can also seek to a time, keep
// snapshots and detach push endpoints.
var (
	_ broker.Broker         = (*Client)(nil)
	_ broker.TimeSeeker     = (*Client)(nil)
	_ broker.Snapshotter    = (*Client)(nil)
	_ broker.PushConfigurer = (*Client)(nil)
)

// Options configure a Client.
type Options struct {
	// Settings are the publish settings of every topic publisher. Zero means
	// DefaultSettings.
	Settings *pubsub.PublishSettings
	// ClientOptions are passed to pubsub.NewClient (credentials, endpoint).
	ClientOptions []option.ClientOption
	// Provision configures the Provision method: no dead-letter policy by
	// default.
	Provision ProvisionOptions
}

// DefaultSettings are the client's defaults with a 1 ms bundling delay instead
// of 10 ms, so a single message (publish's fast path, a dead letter, a rollup
// notice) leaves at once, while a relay batch still bundles per key.
func DefaultSettings() pubsub.PublishSettings {
	s := pubsub.DefaultPublishSettings
	s.DelayThreshold = time.Millisecond
	s.Timeout = 30 * time.Second
	s.FlowControlSettings.MaxOutstandingMessages = 100_000
	s.FlowControlSettings.MaxOutstandingBytes = 512 << 20
	s.FlowControlSettings.LimitExceededBehavior = pubsub.FlowControlBlock
	return s
}

// Client publishes to any number of topics of one project.
type Client struct {
	ps        *pubsub.Client
	settings  pubsub.PublishSettings
	provision ProvisionOptions
	owned     bool

	mu         sync.Mutex
	publishers map[string]*pubsub.Publisher
	closed     bool
	subs       map[string]subscriptionInfo // Pull's lookups
}

// New connects to Pub/Sub for project. When PUBSUB_EMULATOR_HOST is set the
// client library talks to that emulator.
func New(ctx context.Context, project string, opts Options) (*Client, error) {
	ps, err := pubsub.NewClient(ctx, project, opts.ClientOptions...)
	if err != nil {
		return nil, fmt.Errorf("pubsub client for %s: %w", project, err)
	}
	c := Wrap(ps, opts)
	c.owned = true
	return c, nil
}

// Dial connects to a Pub/Sub server at addr without credentials: pstest or
// an emulator.
func Dial(ctx context.Context, project, addr string, opts Options) (*Client, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	opts.ClientOptions = append(opts.ClientOptions, option.WithGRPCConn(conn))
	c, err := New(ctx, project, opts)
	if err != nil {
		_ = conn.Close() // the client that would have closed it was not made
		return nil, err
	}
	return c, nil
}

// Wrap makes a Client of an existing pubsub client, which the caller keeps
// owning (Close stops the publishers but leaves ps open).
func Wrap(ps *pubsub.Client, opts Options) *Client {
	s := DefaultSettings()
	if opts.Settings != nil {
		s = *opts.Settings
	}
	return &Client{ps: ps, settings: s, provision: opts.Provision, publishers: map[string]*pubsub.Publisher{}}
}

// PubSub returns the underlying client, for administration and subscribing.
func (c *Client) PubSub() *pubsub.Client { return c.ps }

// Project returns the project id.
func (c *Client) Project() string { return c.ps.Project() }

// ErrClosed is returned by publishes after Close.
var ErrClosed = errors.New("pubsub: client closed")

func (c *Client) publisher(topic string) (*pubsub.Publisher, error) {
	id := names.ResourceID(topic)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	p, ok := c.publishers[id]
	if !ok {
		p = c.ps.Publisher(id)
		p.EnableMessageOrdering = true
		p.PublishSettings = c.settings
		c.publishers[id] = p
	}
	return p, nil
}

// Result is the outcome of an asynchronous publish.
type Result interface {
	// Get waits for the outcome and returns the message id.
	Get(ctx context.Context) (string, error)
}

// PublishAsync queues m for topic and returns at once. If the publish fails,
// the message's ordering key stays paused until Resume: the caller must call
// Resume(topic, key) once it has dealt with the failure.
func (c *Client) PublishAsync(ctx context.Context, topic string, m event.Message) Result {
	p, err := c.publisher(topic)
	if err != nil {
		return failed{err}
	}
	return p.Publish(ctx, &pubsub.Message{Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey})
}

// Publish sends m to topic and waits for the answer. On failure it resumes
// the message's ordering key before returning, so one failed message does
// not block the key's later publishes.
func (c *Client) Publish(ctx context.Context, topic string, m event.Message) (string, error) {
	id, err := c.PublishAsync(ctx, topic, m).Get(ctx)
	if err != nil {
		c.Resume(topic, m.OrderingKey)
		return "", fmt.Errorf("publish to %s: %w", names.ResourceID(topic), err)
	}
	return id, nil
}

// Pub/Sub's limits on one Publish request
// (https://cloud.google.com/pubsub/quotas#resource_limits): 1,000 messages
// and 10 MB. A request is cut below the byte limit, with room for the
// request's own framing.
const (
	maxRequestMessages = 1000
	maxRequestBytes    = 9 << 20
)

// PublishBatch publishes msgs to topic in order and returns how many
// Pub/Sub acknowledged: all of them, or the prefix before the first request
// that failed, with its error. It sends as few Publish requests as Pub/Sub's
// limits allow, one at a time, so messages that share an ordering key keep
// their order: Pub/Sub orders a key's messages as it receives them, in
// request order, and a request's messages in their order in it
// (https://cloud.google.com/pubsub/docs/ordering). It bypasses the client
// library's publisher (and its per-key bundling delay and pause on error):
// the relay hands over each aggregate's run as one bundle and handles
// failures per aggregate itself. The request is retried on transient errors
// by the client's call options; a message may then be stored twice, which
// the consumers' inboxes absorb.
func (c *Client) PublishBatch(ctx context.Context, topic string, msgs []event.Message) (int, error) {
	name := fmt.Sprintf("projects/%s/topics/%s", c.ps.Project(), names.ResourceID(topic))
	acked := 0
	for acked < len(msgs) {
		req := &pb.PublishRequest{Topic: name}
		size := 0
		for _, m := range msgs[acked:] {
			n := len(m.Data) + len(m.OrderingKey) + 64
			for k, v := range m.Attributes {
				n += len(k) + len(v) + 8
			}
			if len(req.Messages) > 0 && (len(req.Messages) == maxRequestMessages || size+n > maxRequestBytes) {
				break
			}
			size += n
			req.Messages = append(req.Messages, &pb.PubsubMessage{Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey})
		}
		if _, err := c.ps.TopicAdminClient.Publish(ctx, req); err != nil {
			return acked, fmt.Errorf("publish to %s: %w", names.ResourceID(topic), err)
		}
		acked += len(req.Messages)
	}
	return acked, nil
}

// Resume lets an ordering key publish again after a failure.
func (c *Client) Resume(topic, orderingKey string) {
	if orderingKey == "" {
		return
	}
	if p, err := c.publisher(topic); err == nil {
		p.ResumePublish(orderingKey)
	}
}

// Flush sends every queued message of topic now and waits for them.
func (c *Client) Flush(topic string) {
	if p, err := c.publisher(topic); err == nil {
		p.Flush()
	}
}

// IsPaused reports whether err means the ordering key was paused by an
// earlier failure rather than failing itself.
func IsPaused(err error) bool {
	var paused pubsub.ErrPublishingPaused
	return errors.As(err, &paused)
}

// Close flushes and stops every publisher, then closes the underlying client
// if New or Dial created it.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	pubs := c.publishers
	c.mu.Unlock()
	for _, p := range pubs {
		p.Stop()
	}
	if c.owned {
		return c.ps.Close()
	}
	return nil
}

type failed struct{ err error }

func (f failed) Get(context.Context) (string, error) { return "", f.err }
