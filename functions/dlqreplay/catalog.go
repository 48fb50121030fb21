package dlqreplay

import (
	"log/slog"
	"net/http"
	"sync"

	"github.com/relaybus/relaybus/internal/catalog"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/schema"
	"github.com/relaybus/relaybus/shared/topology"
)

// catalogView serves the event catalog (internal/catalog): the topology's
// topics, schema versions, publishers and consumers, each consumer with
// its live registry entry.
type catalogView struct {
	topology *topology.Topology
	registry *consumers.Registry
	pull     pullSet
	logger   *slog.Logger

	// The schemas are compiled on the first request: an API whose image
	// lacks a schema file still serves everything else, and the catalog
	// then says which file it could not read.
	once      sync.Once
	schemas   *schema.Set
	schemaErr error
}

// get: GET /catalog?topic=, the catalog (of one topic with topic).
func (cv *catalogView) get(r *request, _ []string) (any, error) {
	q := newQuery(r.Request, "topic")
	topic := q.topic("topic")
	if err := q.err(); err != nil {
		return nil, err
	}
	if cv.topology == nil {
		return nil, fail(http.StatusNotImplemented, "unavailable", "the catalog needs the topology (RELAYBUS_TOPOLOGY), which this API was not given")
	}
	cv.once.Do(func() {
		if cv.schemas, cv.schemaErr = schema.Load(cv.topology); cv.schemaErr != nil {
			cv.logger.ErrorContext(r.Context(), "dlqreplay: the catalog shows the schemas' declarations only", "error", cv.schemaErr.Error())
		}
	})
	entries, err := cv.registry.Consumers(r.Context())
	if err != nil {
		return nil, err
	}
	regs := make([]catalog.Registration, 0, len(entries))
	for _, e := range entries {
		regs = append(regs, catalog.Registration{Topic: e.Topic, ConsumerID: e.ConsumerID, Enabled: e.Enabled, UpdatedAt: e.UpdatedAt, UpdatedBy: e.UpdatedBy})
	}
	c := catalog.Build(cv.topology, catalog.Options{Schemas: cv.schemas, Registry: regs, PullConsumers: cv.pull})
	if topic != "" {
		t := c.Topic(topic)
		if t == nil {
			return nil, fail(http.StatusNotFound, "not_found", "the topology declares no topic %s", topic)
		}
		c.Topics = []catalog.Topic{*t}
	}
	out := map[string]any{"catalog": c}
	if cv.schemaErr != nil {
		out["schemaError"] = "the schema files could not be compiled, so the catalog shows their declarations only: " + cv.schemaErr.Error()
	}
	return out, nil
}
