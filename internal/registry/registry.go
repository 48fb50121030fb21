// Package registry answers "which consumers expect events on this topic?",
// the question publish asks before it accepts an event (a topic nobody
// consumes is refused: an event nobody would consume is not sent) and the relay asks when it
// records an event's expected consumers in the ledger.
//
// The production registry is the ledger's topic_consumers collection
// (internal/ledger); [FromTopology] answers from the topology file, and [Cached]
// puts a short-lived cache in front of either.
package registry

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/relaybus/relaybus/shared/topology"
)

// Consumer is one consumer registered for a topic (a topic_consumers entry).
type Consumer struct {
	Topic       string `json:"topic" firestore:"topic"`
	ConsumerID  string `json:"consumerId" firestore:"consumerId"`
	Enabled     bool   `json:"enabled" firestore:"enabled"`
	SortOrder   int    `json:"sortOrder" firestore:"sortOrder"`
	Description string `json:"description,omitempty" firestore:"description"`
}

// Registry looks up a topic's consumers.
type Registry interface {
	// ExpectedConsumers returns the enabled consumers of topic, ordered by
	// sort order then consumer id. No consumers is an empty result, not an
	// error.
	ExpectedConsumers(ctx context.Context, topic string) ([]Consumer, error)
}

// FromTopology returns a registry that answers from a topology.
func FromTopology(t *topology.Topology) Registry { return topologyRegistry{t} }

type topologyRegistry struct{ t *topology.Topology }

func (r topologyRegistry) ExpectedConsumers(_ context.Context, topic string) ([]Consumer, error) {
	var out []Consumer
	for _, c := range r.t.EnabledConsumers(topic) {
		out = append(out, Consumer{Topic: topic, ConsumerID: c.Service, Enabled: true, SortOrder: c.SortOrder, Description: c.Description})
	}
	return out, nil
}

// Consumers lists every consumer a topology declares, disabled ones too, as
// registry entries: what the ledger's topic_consumers collection is seeded with.
func Consumers(t *topology.Topology) []Consumer {
	var out []Consumer
	for _, c := range t.Consumers() {
		out = append(out, Consumer{Topic: c.Topic, ConsumerID: c.Service, Enabled: c.IsEnabled(), SortOrder: c.SortOrder, Description: c.Description})
	}
	return out
}

// DefaultCacheTTL is how long Cached keeps an answer fresh when given no TTL.
const DefaultCacheTTL = 30 * time.Second

// Cached returns a registry that keeps each topic's answer (errors are not
// kept), so a burst of publishes costs one lookup per topic, and that never
// makes a caller wait for a topic it has answered before: past ttl the old
// answer is still given while one lookup refreshes it in the background.
// Only a topic never seen waits for its lookup.
func Cached(r Registry, ttl time.Duration) Registry {
	if ttl <= 0 {
		ttl = DefaultCacheTTL
	}
	return &cached{next: r, ttl: ttl, now: time.Now, entries: map[string]*cacheEntry{}}
}

type cacheEntry struct {
	consumers  []Consumer
	expires    time.Time
	refreshing bool
}

type cached struct {
	next    Registry
	ttl     time.Duration
	now     func() time.Time
	mu      sync.Mutex
	entries map[string]*cacheEntry
	wg      sync.WaitGroup // background refreshes, for tests
}

func (c *cached) ExpectedConsumers(ctx context.Context, topic string) ([]Consumer, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[topic]
	if ok {
		if !now.Before(e.expires) && !e.refreshing {
			e.refreshing = true
			c.wg.Add(1)
			go c.refresh(context.WithoutCancel(ctx), topic)
		}
		consumers := e.consumers
		c.mu.Unlock()
		return consumers, nil
	}
	c.mu.Unlock()
	consumers, err := c.next.ExpectedConsumers(ctx, topic)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.entries[topic] = &cacheEntry{consumers: consumers, expires: now.Add(c.ttl)}
	c.mu.Unlock()
	return consumers, nil
}

// refreshTimeout bounds a background refresh.
const refreshTimeout = 10 * time.Second

func (c *cached) refresh(ctx context.Context, topic string) {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(ctx, refreshTimeout)
	defer cancel()
	consumers, err := c.next.ExpectedConsumers(ctx, topic)
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[topic]
	e.refreshing = false
	if err == nil {
		e.consumers, e.expires = consumers, c.now().Add(c.ttl)
	}
}

// Warm looks up the given topics in r now, if r is a Cached registry (a
// function instance warms its cache at start, so no request waits for
// one), and returns the first error. Other registries have nothing to warm.
func Warm(ctx context.Context, r Registry, topics ...string) error {
	c, ok := r.(*cached)
	if !ok {
		return nil
	}
	var errs []error
	for _, t := range topics {
		if _, err := c.ExpectedConsumers(ctx, t); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// WithFallback returns a registry that asks r, within timeout, and asks
// fallback when r fails or takes longer: publish puts the topology file
// behind the ledger's topic_consumers, so a Firestore outage at a cold
// start does not refuse events.
func WithFallback(r, fallback Registry, timeout time.Duration) Registry {
	return fallbackRegistry{r, fallback, timeout}
}

type fallbackRegistry struct {
	r, fallback Registry
	timeout     time.Duration
}

func (f fallbackRegistry) ExpectedConsumers(ctx context.Context, topic string) ([]Consumer, error) {
	tctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	if cs, err := f.r.ExpectedConsumers(tctx, topic); err == nil {
		return cs, nil
	}
	return f.fallback.ExpectedConsumers(ctx, topic)
}
