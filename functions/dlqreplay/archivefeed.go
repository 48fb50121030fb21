package dlqreplay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/relaybus/relaybus/internal/bridge"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/topology"
)

// Archive modes ARCHIVE_MODE names: how the DLQ monitors' deliveries reach
// the archive.
const (
	// ArchiveModePush: each topic's <topic>.dlq-monitor subscription pushes
	// to POST /deadletters:archive (Pub/Sub; the default).
	ArchiveModePush = "push"
	// ArchiveModePull: the function pulls every <topic>.dlq-monitor
	// durable consumer itself (NATS JetStream, which has no push): the
	// same archive, fed in process.
	ArchiveModePull = "pull"
)

// archiveFeed archives each dead letter the pull feeds it. It is not
// routed: only the function's own feed reaches it, so it checks no
// caller (the route's archivers list is for pushes from outside).
type archiveFeed struct{ lt *letters }

func (f archiveFeed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, err := f.lt.archiveDelivery(r, "archive-feed"); err != nil {
		status := http.StatusInternalServerError
		var ae *apiError
		if errors.As(err, &ae) {
			status = ae.status
		}
		f.lt.logger.ErrorContext(r.Context(), "dlqreplay: dead letter not archived; the feed retries it", "error", err.Error())
		w.WriteHeader(status)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// startArchiveFeed provisions the topology on b (idempotent: the deployed
// rollup does the same at its start) and feeds every topic's DLQ monitor
// to h's archive until the returned function stops it: the dead letters
// in flight finish (within its ctx), the rest are handed back.
func startArchiveFeed(ctx context.Context, b broker.Broker, project string, top *topology.Topology, h http.Handler, log *slog.Logger) (func(context.Context) error, error) {
	s, ok := h.(*server)
	if !ok {
		return nil, fmt.Errorf("dlqreplay: archive feed: a handler of type %T", h)
	}
	if err := b.Provision(ctx, top); err != nil {
		return nil, fmt.Errorf("dlqreplay: provision the broker: %w", err)
	}
	routes := make([]bridge.Route, 0, len(top.Topics))
	for _, t := range top.Topics {
		routes = append(routes, bridge.Route{Subscription: names.DeadLetterMonitor(t.Name), Handler: s.archiveFeed})
	}
	fctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() {
		done <- bridge.Run(fctx, bridge.Options{Source: b, Project: project, Routes: routes, Logger: log})
	}()
	log.Info("dlqreplay: pulling the DLQ monitors", "subscriptions", len(routes))
	return func(ctx context.Context) error {
		stop()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return fmt.Errorf("dlqreplay: archive feed still draining at shutdown: %w", ctx.Err())
		}
	}, nil
}
