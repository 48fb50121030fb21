package consumers

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/ledger/internal/fsdoc"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
)

// consumerDoc is a topic_consumers document.
type consumerDoc struct {
	Topic       string    `firestore:"topic"`
	ConsumerID  string    `firestore:"consumerId"`
	Enabled     bool      `firestore:"enabled"`
	SortOrder   int       `firestore:"sortOrder"`
	Description string    `firestore:"description"`
	CreatedAt   time.Time `firestore:"createdAt"`
	UpdatedAt   time.Time `firestore:"updatedAt"`
	// UpdatedBy is set by an operator's edit (ChangeConsumer): the entry is
	// the operator's from then on, and SyncConsumers leaves it alone.
	UpdatedBy string `firestore:"updatedBy,omitempty"`
}

// ExpectedConsumers implements registry.Registry over the topic_consumers
// collection: the enabled consumers of topic, by sort order then id. It
// reads every entry of the topic (a handful) each time; put
// registry.Cached in front of it on hot paths.
func (s *Registry) ExpectedConsumers(ctx context.Context, topic string) ([]registry.Consumer, error) {
	all, err := s.topicConsumers(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, c := range all {
		if c.Enabled {
			out = append(out, c)
		}
	}
	return out, nil
}

// topicConsumers returns every entry of a topic, enabled or not.
func (s *Registry) topicConsumers(ctx context.Context, topic string) ([]registry.Consumer, error) {
	docs, err := fsdoc.Query(ctx, nil, fsdoc.ShapeConsumersByTopic.Query(s.consumers.Query, map[string]any{"topic": topic}))
	if err != nil {
		return nil, fmt.Errorf("ledger: consumers of %s: %w", topic, err)
	}
	out := make([]registry.Consumer, 0, len(docs))
	for _, d := range docs {
		var c consumerDoc
		if err := d.DataTo(&c); err != nil {
			return nil, fmt.Errorf("ledger: decode %s/%s: %w", model.CollectionConsumers, d.Ref.ID, err)
		}
		out = append(out, registry.Consumer{Topic: c.Topic, ConsumerID: c.ConsumerID, Enabled: c.Enabled, SortOrder: c.SortOrder, Description: c.Description})
	}
	sortConsumers(out)
	return out, nil
}

func sortConsumers(cs []registry.Consumer) {
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].SortOrder != cs[j].SortOrder {
			return cs[i].SortOrder < cs[j].SortOrder
		}
		return cs[i].ConsumerID < cs[j].ConsumerID
	})
}

// SyncReport says what SyncConsumers changed. Kept counts the entries an
// operator edited, which the sync leaves as they are (see SyncConsumers).
type SyncReport struct {
	Created, Updated, Disabled, Unchanged, Kept int
}

// SyncOptions tune SyncConsumers.
type SyncOptions struct {
	// DisableUnlisted disables (enabled=false, never deletes) entries of
	// topic_consumers that entries does not list, so the collection matches
	// the topology exactly.
	DisableUnlisted bool
}

// SyncConsumers makes topic_consumers hold entries (registry.Consumers of
// the topology): missing entries are created, changed ones updated, and
// with DisableUnlisted the others disabled. Entries already as listed are
// not written, so running it again writes nothing. Each entry's document id
// is ConsumerDocID(topic, consumerId): one document per topic and consumer.
//
// Ownership: the topology owns the entries it declares, operators own
// their edits. An entry an operator changed or added (ChangeConsumer, which
// records updatedBy) is never rewritten nor disabled by a sync, so a deploy
// does not undo an operator's edit; it is counted in Kept. Only entries the
// sync itself wrote follow the topology.
func (s *Registry) SyncConsumers(ctx context.Context, entries []registry.Consumer, opts SyncOptions) (SyncReport, error) {
	var rep SyncReport
	want := make(map[string]registry.Consumer, len(entries))
	for i, e := range entries {
		var errs []error
		if err := names.ValidateTopic(e.Topic); err != nil {
			errs = append(errs, &event.FieldError{Field: fmt.Sprintf("consumers[%d].topic", i), Rule: names.TopicRule})
		}
		if err := names.ValidateConsumer(e.ConsumerID); err != nil {
			errs = append(errs, &event.FieldError{Field: fmt.Sprintf("consumers[%d].consumerId", i), Rule: names.ConsumerRule})
		}
		if err := errors.Join(errs...); err != nil {
			return rep, fmt.Errorf("ledger: sync consumers: %w", err)
		}
		id := model.ConsumerDocID(e.Topic, e.ConsumerID)
		if _, dup := want[id]; dup {
			return rep, fmt.Errorf("ledger: sync consumers: %w", &event.FieldError{Field: fmt.Sprintf("consumers[%d]", i), Rule: "topic and consumerId must be unique (" + id + " repeats)"})
		}
		want[id] = e
	}
	docs, err := fsdoc.Query(ctx, nil, fsdoc.ShapeAllConsumers.Query(s.consumers.Query, nil))
	if err != nil {
		return rep, fmt.Errorf("ledger: sync consumers: read %s: %w", model.CollectionConsumers, err)
	}
	have := make(map[string]consumerDoc, len(docs))
	for _, d := range docs {
		var c consumerDoc
		if err := d.DataTo(&c); err != nil {
			return rep, fmt.Errorf("ledger: sync consumers: decode %s: %w", d.Ref.ID, err)
		}
		have[d.Ref.ID] = c
	}
	now := s.clock()
	bw := s.client.BulkWriter(ctx)
	var jobs []*firestore.BulkWriterJob
	enqueue := func(j *firestore.BulkWriterJob, err error) error {
		if err != nil {
			return err
		}
		jobs = append(jobs, j)
		return nil
	}
	var werr error
	for _, id := range fsdoc.SortedKeys(want) {
		e := want[id]
		cur, ok := have[id]
		ref := s.consumers.Doc(id)
		switch {
		case ok && cur.UpdatedBy != "":
			rep.Kept++ // an operator's edit: theirs
		case !ok:
			rep.Created++
			werr = enqueue(bw.Create(ref, consumerDoc{Topic: e.Topic, ConsumerID: e.ConsumerID, Enabled: e.Enabled, SortOrder: e.SortOrder, Description: e.Description, CreatedAt: now, UpdatedAt: now}))
		case cur.Enabled != e.Enabled || cur.SortOrder != e.SortOrder || cur.Description != e.Description || cur.Topic != e.Topic || cur.ConsumerID != e.ConsumerID:
			rep.Updated++
			werr = enqueue(bw.Update(ref, []firestore.Update{
				{Path: "topic", Value: e.Topic}, {Path: "consumerId", Value: e.ConsumerID},
				{Path: "enabled", Value: e.Enabled}, {Path: "sortOrder", Value: e.SortOrder},
				{Path: "description", Value: e.Description}, {Path: "updatedAt", Value: now},
			}))
		default:
			rep.Unchanged++
		}
		if werr != nil {
			break
		}
	}
	if opts.DisableUnlisted && werr == nil {
		for _, id := range fsdoc.SortedKeys(have) {
			if _, listed := want[id]; listed {
				continue
			}
			if have[id].UpdatedBy != "" {
				rep.Kept++ // an operator added or edited it: theirs
				continue
			}
			if !have[id].Enabled {
				rep.Unchanged++
				continue
			}
			rep.Disabled++
			if werr = enqueue(bw.Update(s.consumers.Doc(id), []firestore.Update{{Path: "enabled", Value: false}, {Path: "updatedAt", Value: now}})); werr != nil {
				break
			}
		}
	}
	bw.End()
	errs := []error{werr}
	for _, j := range jobs {
		if _, err := j.Results(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return rep, fmt.Errorf("ledger: sync consumers: %w", err)
	}
	return rep, nil
}
