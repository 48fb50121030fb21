package dlqreplay

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/shared/outbox"
)

// scheduled serves the outboxes' scheduled events: listing them and
// cancelling one before it is due (docs/producing.md, "Scheduled events").
type scheduled struct {
	dbs    databases
	g      *guard
	logger *slog.Logger
}

// scheduledRow is one scheduled event of the listing.
type scheduledRow struct {
	Database      string    `json:"database"`
	EventID       string    `json:"eventId"`
	Topic         string    `json:"topic"`
	EventType     string    `json:"eventType"`
	AggregateType string    `json:"aggregateType"`
	AggregateID   string    `json:"aggregateId"`
	Version       int64     `json:"version"`
	DeliverAt     time.Time `json:"deliverAt"`
	EnqueuedAt    time.Time `json:"enqueuedAt"`
	// Due: its time has passed; the relay publishes it next unless an
	// earlier version of its aggregate still holds it.
	Due bool `json:"due"`
}

// list: GET /scheduled ?limit= (1..500, default 100): each outbox's
// first limit scheduled events (unpublished, not cancelled) on topics the
// caller may view, merged by deliverAt.
func (s *scheduled) list(r *request, _ []string) (any, error) {
	q := newQuery(r.Request, "limit")
	limit := q.integer("limit", 1, 500)
	if err := q.err(); err != nil {
		return nil, err
	}
	if limit == 0 {
		limit = 100
	}
	dbs := s.dbs.all()
	rows := []scheduledRow{}
	truncated := false
	for _, name := range sortedKeys(dbs) {
		got, err := outbox.Scheduled(r.Context(), dbs[name], outbox.ScheduledOptions{Limit: limit})
		if err != nil {
			return nil, err
		}
		truncated = truncated || len(got) == limit
		for _, e := range got {
			if !r.rights.grants(RoleViewer, e.Topic, "") {
				continue
			}
			rows = append(rows, scheduledRow{Database: name, EventID: e.ID, Topic: e.Topic, EventType: e.Type,
				AggregateType: e.Aggregate.Type, AggregateID: e.Aggregate.ID, Version: e.Version,
				DeliverAt: e.DeliverAt, EnqueuedAt: e.EnqueuedAt, Due: e.Due})
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].DeliverAt.Before(rows[j].DeliverAt) })
	return map[string]any{"scheduled": rows, "truncated": truncated}, nil
}

// cancel: POST /scheduled/{id}:cancel {"reason"}: an operator on the
// event's topic cancels it before it is due (outbox.Cancel's rules: the
// aggregate's first unpublished version, its deliverAt still ahead).
func (s *scheduled) cancel(r *request, args []string) (any, error) {
	id, err := eventID(r, args[0])
	if err != nil {
		return nil, err
	}
	var b struct {
		Reason string `json:"reason"`
	}
	if err := decodeBody(r.Request, &b, true); err != nil {
		return nil, err
	}
	var bad invalid
	if len(b.Reason) > 500 {
		bad.add("reason", "at most 500 characters")
	}
	if err := bad.err(); err != nil {
		return nil, err
	}
	name, found, err := s.find(r, id)
	if err != nil {
		return nil, err
	}
	if err := s.g.authorize(r, audit.EventCancel, RoleOperator, target{Topic: found.Topic}); err != nil {
		return nil, err
	}
	var res outbox.Enqueued
	err = s.g.run(r, audit.Entry{Action: audit.EventCancel, EventID: id, Topic: found.Topic,
		Detail: fmt.Sprintf("cancel scheduled %s/%s version %d (due %s): %s", found.Aggregate.Type, found.Aggregate.ID,
			found.Version, found.DeliverAt.Format(time.RFC3339), b.Reason)}, func(*step) (string, error) {
		var err error
		res, err = outbox.Cancel(r.Context(), s.dbs.mustOf(name), id, outbox.CancelOptions{By: r.who.Name, Reason: b.Reason})
		switch {
		case errors.Is(err, outbox.ErrNotScheduled), errors.Is(err, outbox.ErrAlreadyDue), errors.Is(err, outbox.ErrNotHead):
			return "", fail(http.StatusConflict, "not_cancellable", "%v", err)
		case err != nil:
			return "", err
		}
		return "cancelled: never published; its aggregate's later versions flow", nil
	})
	if err != nil {
		return nil, err
	}
	return map[string]any{"eventId": id, "database": name, "state": res.State, "aggregateType": res.Aggregate.Type,
		"aggregateId": res.Aggregate.ID, "version": res.Version, "deliverAt": res.DeliverAt}, nil
}

// find looks the event up in every outbox dlqreplay reaches: its
// database and row, or 404.
func (s *scheduled) find(r *request, id string) (string, outbox.Enqueued, error) {
	dbs := s.dbs.all()
	for _, name := range sortedKeys(dbs) {
		got, err := outbox.Lookup(r.Context(), dbs[name], id)
		if err != nil {
			return "", outbox.Enqueued{}, err
		}
		if e, ok := got[id]; ok {
			return name, e, nil
		}
	}
	return "", outbox.Enqueued{}, fail(http.StatusNotFound, "not_found", "no outbox holds an event with that id")
}
