// Package contract is the event contract every send path checks before it
// writes (publish, outbox.Producer, a handler's Emit): an event's payload
// against its topic's schema for its schemaVersion (internal/schema), and
// whether the topic is declared and has an enabled consumer (a topic
// nobody consumes is an ERROR and nothing is written, the caller
// unharmed: docs/producing.md).
package contract

import (
	"context"
	"fmt"

	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/internal/schema"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// Contract checks events against a topology's schemas and consumers. It
// implements outbox.Contract.
type Contract struct {
	top      *topology.Topology
	schemas  *schema.Set
	registry registry.Registry
}

// Options configure a Contract. Topology is required.
type Options struct {
	// Topology declares the topics and their schemas.
	Topology *topology.Topology
	// Schemas are the topology's schemas, compiled (schema.Load of
	// Topology when nil).
	Schemas *schema.Set
	// Registry says which consumers expect a topic's events
	// (registry.FromTopology of Topology when nil; the publish function
	// passes its cached Firestore registry).
	Registry registry.Registry
}

// New returns the contract of a topology, compiling its schemas unless
// o.Schemas has them.
func New(o Options) (*Contract, error) {
	if o.Topology == nil {
		return nil, fmt.Errorf("contract: Options.Topology is required")
	}
	if o.Schemas == nil {
		s, err := schema.Load(o.Topology)
		if err != nil {
			return nil, fmt.Errorf("contract: %w", err)
		}
		o.Schemas = s
	}
	if o.Registry == nil {
		o.Registry = registry.FromTopology(o.Topology)
	}
	return &Contract{top: o.Topology, schemas: o.Schemas, registry: o.Registry}, nil
}

// Schemas returns the compiled schemas.
func (c *Contract) Schemas() *schema.Set { return c.schemas }

// Check validates e (normalized: its schemaVersion and payloadType set)
// against its topic's schema, then skips it when the topic is not declared
// or has no enabled consumer. A schema mismatch is a *schema.Error; a
// registry that cannot answer is returned wrapped.
func (c *Contract) Check(ctx context.Context, e *event.Event) (string, error) {
	if err := c.schemas.Check(e); err != nil {
		return "", err
	}
	if c.top.Topic(e.Topic) == nil {
		return fmt.Sprintf("topic %s is not declared in the topology (infra/topology.yaml); nothing was recorded or published", e.Topic), nil
	}
	cs, err := c.registry.ExpectedConsumers(ctx, e.Topic)
	if err != nil {
		return "", fmt.Errorf("contract: the topic registry for %s: %w", e.Topic, err)
	}
	if len(cs) == 0 {
		return fmt.Sprintf("topic %s has no enabled consumer in the topic registry; nothing was recorded or published", e.Topic), nil
	}
	return "", nil
}
