package query

import (
	"context"
	"fmt"
	"github.com/relaybus/relaybus/internal/ledger"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/relaybus/relaybus/shared/event"
)

func searchAll(t *testing.T, s *testStore, q SearchQuery) []string {
	t.Helper()
	var ids []string
	for pages := 0; ; pages++ {
		p, err := s.Search(context.Background(), q)
		if err != nil {
			t.Fatalf("search %+v: %v", q, err)
		}
		for _, e := range p.Events {
			ids = append(ids, e.EventID)
		}
		if p.NextPageToken == "" {
			return ids
		}
		if pages > 100 {
			t.Fatal("paging does not end")
		}
		q.PageToken = p.NextPageToken
	}
}

func TestSearchByEventTypeAndAggregate(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, ledger.Options{})
	seed(t, s, orderTopic, "member-service")
	base := time.Date(2024, 3, 1, 10, 0, 0, 0, time.UTC)
	type fx struct {
		e  *event.Event
		at time.Time
		st model.Status
	}
	var all []fx
	for i := range 20 {
		typ := []string{"order.purchased", "order.cancelled"}[i%2]
		at := base.Add(time.Duration(i) * time.Minute)
		e := newEventOn(t, orderTopic, typ, at)
		e.AggregateID = fmt.Sprintf("order-%d", i%3)
		e.Version = int64(i/3 + 1)
		if err := s.RecordSent(ctx, model.SentAt(at, e)); err != nil {
			t.Fatal(err)
		}
		st := model.StatusSent
		if i%4 == 0 {
			st = model.StatusConsumed
			_, _ = s.InsertAttempt(ctx, attempt(e, "member-service", 1, model.OutcomeSuccess))
			if _, err := s.Rollup(ctx, e.ID); err != nil {
				t.Fatal(err)
			}
		}
		all = append(all, fx{e, at, st})
	}
	want := func(match func(fx) bool) []string {
		var fs []fx
		for _, f := range all {
			if match(f) {
				fs = append(fs, f)
			}
		}
		sort.Slice(fs, func(i, j int) bool { return fs[i].at.After(fs[j].at) })
		var ids []string
		for _, f := range fs {
			ids = append(ids, f.e.ID)
		}
		return ids
	}
	from := base.Add(5 * time.Minute)
	for _, c := range []struct {
		name  string
		q     SearchQuery
		match func(fx) bool
	}{
		{"event type", SearchQuery{EventType: "order.cancelled"}, func(f fx) bool { return f.e.Type == "order.cancelled" }},
		{"aggregate", SearchQuery{AggregateID: "order-1"}, func(f fx) bool { return f.e.AggregateID == "order-1" }},
		{"aggregate and type", SearchQuery{AggregateID: "order-2", EventType: "order.purchased"}, func(f fx) bool {
			return f.e.AggregateID == "order-2" && f.e.Type == "order.purchased"
		}},
		{"type, status and from", SearchQuery{EventType: "order.purchased", ListQuery: ListQuery{Status: model.StatusConsumed, From: from}}, func(f fx) bool {
			return f.e.Type == "order.purchased" && f.st == model.StatusConsumed && !f.at.Before(from)
		}},
		{"nothing", SearchQuery{AggregateID: "order-9"}, func(fx) bool { return false }},
	} {
		for _, size := range []int{1, 3, 50} {
			t.Run(fmt.Sprintf("%s/page%d", c.name, size), func(t *testing.T) {
				q := c.q
				q.PageSize = size
				got, w := searchAll(t, s, q), want(c.match)
				if strings.Join(got, ",") != strings.Join(w, ",") {
					t.Errorf("got %v\nwant %v", got, w)
				}
			})
		}
	}
	// A token from one search is refused by another.
	p, err := s.Search(ctx, SearchQuery{EventType: "order.purchased", ListQuery: ListQuery{PageSize: 1}})
	if err != nil || p.NextPageToken == "" {
		t.Fatalf("first page: %v %q", err, p.NextPageToken)
	}
	_, err = s.Search(ctx, SearchQuery{EventType: "order.cancelled", ListQuery: ListQuery{PageSize: 1, PageToken: p.NextPageToken}})
	if got := fieldErrs(err); strings.Join(got, ",") != "pageToken" {
		t.Errorf("token of another search: %v (fields %v)", err, got)
	}
	_, err = s.Search(ctx, SearchQuery{EventType: "no spaces", AggregateID: "a/b"})
	if got := fieldErrs(err); strings.Join(got, ",") != "eventType,aggregateId" {
		t.Errorf("bad filters: %v (fields %v)", err, got)
	}
}

func TestStatusCountsAndRecentHops(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, ledger.Options{})
	seed(t, s, orderTopic, "member-service", "message-service")
	now := time.Now().UTC()
	old := newEventOn(t, orderTopic, "order.purchased", now.Add(-48*time.Hour))
	if err := s.RecordSent(ctx, model.SentAt(now.Add(-48*time.Hour), old)); err != nil {
		t.Fatal(err)
	}
	var recent []*event.Event
	for i := range 3 {
		e := newEventOn(t, orderTopic, "order.purchased", now.Add(-time.Duration(10-i)*time.Minute))
		// Committed to the outbox 200 ms after it occurred, published 1 s after.
		if err := s.RecordSent(ctx, []model.Sent{{Event: e, EnqueuedAt: e.OccurredAt.Add(200 * time.Millisecond), At: e.OccurredAt.Add(time.Second)}}); err != nil {
			t.Fatal(err)
		}
		recent = append(recent, e)
	}
	done := recent[0]
	for _, c := range []string{"member-service", "message-service"} {
		a := attempt(done, c, 1, model.OutcomeSuccess)
		a.ConsumedAt = done.OccurredAt.Add(3 * time.Second)
		if _, err := s.InsertAttempt(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := s.Rollup(ctx, done.ID); err != nil || res.Status != model.StatusConsumed {
		t.Fatalf("rollup: %+v %v", res, err)
	}
	counts, err := s.StatusCounts(ctx, now.Add(-24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if counts[model.StatusConsumed] != 1 || counts[model.StatusSent] != 2 || counts[model.StatusFailed] != 0 {
		t.Errorf("counts of the last day %v, want 1 CONSUMED, 2 SENT (the 2-day-old event not counted)", counts)
	}
	hops, err := s.RecentHops(ctx, now.Add(-time.Hour), 100, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(hops) != 3 || hops[2].EventID != done.ID {
		t.Fatalf("hops %+v, want the 3 recent events, newest first", hops)
	}
	if hops[0].Consumers == nil || hops[1].Consumers != nil {
		t.Errorf("attempts read for the newest event only? %+v", hops)
	}
	h := hops[2]
	if h.SentAt.Sub(h.EnqueuedAt) != 800*time.Millisecond || h.Status != model.StatusConsumed || h.StatusAt.IsZero() {
		t.Errorf("hops of the consumed event %+v", h)
	}
	hops, _ = s.RecentHops(ctx, now.Add(-time.Hour), 100, 3)
	if c := hops[2].Consumers; len(c) != 2 || c[0].ConsumerID != "member-service" || !c[0].CommittedAt.Equal(done.OccurredAt.Add(3*time.Second).Truncate(time.Microsecond)) {
		t.Errorf("consumer commits %+v", c)
	}
}
