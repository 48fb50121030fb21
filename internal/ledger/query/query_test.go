package query

import (
	"context"
	"errors"
	"fmt"
	"github.com/relaybus/relaybus/internal/ledger"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/shared/event"
)

// listAll follows page tokens to the end and returns the event ids in order.
func listAll(t *testing.T, s *testStore, q ListQuery) ([]string, int) {
	t.Helper()
	var ids []string
	pages := 0
	for {
		p, err := s.List(context.Background(), q)
		if err != nil {
			t.Fatalf("list %+v: %v", q, err)
		}
		pages++
		if len(p.Events) > q.PageSize && q.PageSize > 0 {
			t.Fatalf("page of %d, asked %d", len(p.Events), q.PageSize)
		}
		for _, e := range p.Events {
			ids = append(ids, e.EventID)
			if e.Payload != nil {
				t.Fatal("list read payloads")
			}
		}
		if p.NextPageToken == "" {
			return ids, pages
		}
		q.PageToken = p.NextPageToken
		if pages > 1000 {
			t.Fatal("paging does not end")
		}
	}
}

type fixture struct {
	e        *event.Event
	status   model.Status
	occurred time.Time
}

func TestListFiltersAndPaging(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, ledger.Options{})
	seed(t, s, orderTopic, "member-service")
	seed(t, s, "member.points.events", "audit-service")
	base := time.Date(2024, 2, 28, 10, 0, 0, 0, time.UTC)
	var all []fixture
	traces := []string{"trace-a", "trace-b"}
	services := []string{"order-service", "points-service", "gift-service"}
	for i := 0; i < 36; i++ {
		topic, typ, consumer := orderTopic, "order.purchased", "member-service"
		if i%3 == 0 {
			topic, typ, consumer = "member.points.events", "points.added", "audit-service"
		}
		occurred := base.Add(time.Duration(i) * time.Minute)
		if i%7 == 0 {
			occurred = base.Add(time.Duration(i-1) * time.Minute) // ties on occurredAt
		}
		e := newEventOn(t, topic, typ, occurred)
		e.TraceID = traces[i%2]
		e.Initiator.Service = services[i%3]
		if err := s.RecordSent(ctx, model.SentAt(occurred.Add(time.Second), e)); err != nil {
			t.Fatal(err)
		}
		st := model.StatusSent
		switch i % 4 {
		case 1:
			st = model.StatusConsumed
			_, _ = s.InsertAttempt(ctx, attempt(e, consumer, 1, model.OutcomeSuccess))
		case 2:
			st = model.StatusFailed
			_, _ = s.InsertAttempt(ctx, attempt(e, consumer, 1, model.OutcomeFailed))
		}
		if st != model.StatusSent {
			if res, err := s.Rollup(ctx, e.ID); err != nil || res.Status != st {
				t.Fatalf("rollup %+v %v", res, err)
			}
		}
		all = append(all, fixture{e, st, occurred.Truncate(time.Microsecond)})
	}
	// The expected answer, computed here from what was written.
	want := func(match func(f fixture) bool) []string {
		var fs []fixture
		for _, f := range all {
			if match(f) {
				fs = append(fs, f)
			}
		}
		sort.Slice(fs, func(i, j int) bool {
			if !fs[i].occurred.Equal(fs[j].occurred) {
				return fs[i].occurred.After(fs[j].occurred)
			}
			return model.EventDocID(fs[i].e.ID) > model.EventDocID(fs[j].e.ID)
		})
		ids := make([]string, len(fs))
		for i, f := range fs {
			ids[i] = f.e.ID
		}
		return ids
	}
	from, to := base.Add(5*time.Minute), base.Add(25*time.Minute)
	inRange := func(f fixture) bool { return !f.occurred.Before(from) && f.occurred.Before(to) }

	cases := []struct {
		name  string
		q     ListQuery
		match func(fixture) bool
	}{
		{"everything", ListQuery{}, func(fixture) bool { return true }},
		{"status", ListQuery{Status: model.StatusConsumed}, func(f fixture) bool { return f.status == model.StatusConsumed }},
		{"status, lower case", ListQuery{Status: "failed"}, func(f fixture) bool { return f.status == model.StatusFailed }},
		{"topic", ListQuery{Topic: orderTopic}, func(f fixture) bool { return f.e.Topic == orderTopic }},
		{"initiator", ListQuery{InitiatorService: "gift-service"}, func(f fixture) bool { return f.e.Initiator.Service == "gift-service" }},
		{"status and topic", ListQuery{Status: model.StatusSent, Topic: orderTopic}, func(f fixture) bool { return f.status == model.StatusSent && f.e.Topic == orderTopic }},
		{"status and initiator", ListQuery{Status: model.StatusSent, InitiatorService: "order-service"}, func(f fixture) bool {
			return f.status == model.StatusSent && f.e.Initiator.Service == "order-service"
		}},
		{"topic and initiator", ListQuery{Topic: orderTopic, InitiatorService: "points-service"}, func(f fixture) bool {
			return f.e.Topic == orderTopic && f.e.Initiator.Service == "points-service"
		}},
		{"status, topic and initiator", ListQuery{Status: model.StatusConsumed, Topic: orderTopic, InitiatorService: "points-service"}, func(f fixture) bool {
			return f.status == model.StatusConsumed && f.e.Topic == orderTopic && f.e.Initiator.Service == "points-service"
		}},
		{"time range", ListQuery{From: from, To: to}, inRange},
		{"from only", ListQuery{From: from}, func(f fixture) bool { return !f.occurred.Before(from) }},
		{"status and time range", ListQuery{Status: model.StatusSent, From: from, To: to}, func(f fixture) bool { return f.status == model.StatusSent && inRange(f) }},
		{"trace", ListQuery{TraceID: "trace-a"}, func(f fixture) bool { return f.e.TraceID == "trace-a" }},
		{"trace, status and time range", ListQuery{TraceID: "trace-b", Status: model.StatusSent, From: from, To: to}, func(f fixture) bool {
			return f.e.TraceID == "trace-b" && f.status == model.StatusSent && inRange(f)
		}},
		{"trace, topic and initiator", ListQuery{TraceID: "trace-a", Topic: orderTopic, InitiatorService: "points-service"}, func(f fixture) bool {
			return f.e.TraceID == "trace-a" && f.e.Topic == orderTopic && f.e.Initiator.Service == "points-service"
		}},
		{"nothing matches", ListQuery{Topic: "no.such.events"}, func(fixture) bool { return false }},
	}
	for _, c := range cases {
		for _, size := range []int{0, 1, 4, 7} {
			t.Run(fmt.Sprintf("%s/page%d", c.name, size), func(t *testing.T) {
				q := c.q
				q.PageSize = size
				got, pages := listAll(t, s, q)
				w := want(c.match)
				if strings.Join(got, ",") != strings.Join(w, ",") {
					t.Errorf("got %d events %v\nwant %d %v", len(got), got, len(w), w)
				}
				if size > 0 && pages < (len(w)+size-1)/size {
					t.Errorf("%d pages for %d events of %d", pages, len(w), size)
				}
			})
		}
	}
}

func TestListRefusesBadQueries(t *testing.T) {
	s := newStore(t, ledger.Options{})
	ctx := context.Background()
	p, err := s.List(ctx, ListQuery{Status: model.StatusSent, PageSize: 1})
	if err != nil || len(p.Events) != 0 || p.NextPageToken != "" {
		t.Fatalf("empty ledger: %+v %v", p, err)
	}
	token := encodeToken(time.Now(), "x~y", (&ListQuery{Status: model.StatusSent}).fingerprint())
	for _, c := range []struct {
		q     ListQuery
		field string
	}{
		{ListQuery{Status: "DONE"}, "status"},
		{ListQuery{PageSize: MaxPageSize + 1}, "pageSize"},
		{ListQuery{PageSize: -1}, "pageSize"},
		{ListQuery{From: time.Now(), To: time.Now().Add(-time.Hour)}, "to"},
		{ListQuery{PageToken: "not-a-token"}, "pageToken"},
		{ListQuery{Status: model.StatusFailed, PageToken: token}, "pageToken"}, // token of other filters
	} {
		_, err := s.List(ctx, c.q)
		if !errors.Is(err, event.ErrInvalid) || strings.Join(fieldErrs(err), ",") != c.field {
			t.Errorf("%+v: err %v, want a %s field error", c.q, err, c.field)
		}
	}
	if _, err := s.List(ctx, ListQuery{Status: model.StatusSent, PageToken: token}); err != nil {
		t.Errorf("token with its own filters: %v", err)
	}
}

func TestTraceTree(t *testing.T) {
	mk := func(id, parent string, min int) model.Event {
		return model.Event{EventID: id, ParentEventID: parent, OccurredAt: time.Unix(int64(min)*60, 0)}
	}
	roots := buildTree([]model.Event{
		mk("c2", "root", 3), mk("root", "", 0), mk("c1", "root", 1), mk("g1", "c1", 2),
		mk("orphan", "outside-the-trace", 5),
		mk("x", "y", 6), mk("y", "x", 7), // a cycle (bad data) must not vanish
	})
	var dump func(ns []*TraceNode) string
	dump = func(ns []*TraceNode) string {
		var parts []string
		for _, n := range ns {
			s := n.Event.EventID
			if len(n.Children) > 0 {
				s += "(" + dump(n.Children) + ")"
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, " ")
	}
	if got := dump(roots); got != "root(c1(g1) c2) orphan x(y)" {
		t.Errorf("tree %s", got)
	}
}

func TestGetUnknownEvent(t *testing.T) {
	s := newStore(t, ledger.Options{})
	if _, err := s.Get(context.Background(), "nope"); !errors.Is(err, model.ErrEventNotFound) {
		t.Errorf("Get: %v", err)
	}
	if _, err := s.Trace(context.Background(), "nope"); !errors.Is(err, model.ErrEventNotFound) {
		t.Errorf("Trace: %v", err)
	}
}

// Events reads events by id; ids the ledger does not hold, or that are
// not event ids, are left out.
func TestEventsByID(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, ledger.Options{})
	seed(t, s, orderTopic, "member-service")
	a := newEventOn(t, orderTopic, "order.purchased", time.Now())
	b := newEventOn(t, orderTopic, "order.purchased", time.Now())
	if err := s.RecordSent(ctx, model.SentAt(time.Now(), a, b)); err != nil {
		t.Fatal(err)
	}
	got, err := s.Events(ctx, []string{a.ID, "no-such-event", b.ID, "bad/id"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[a.ID].Status != model.StatusSent || got[b.ID].EventID != b.ID || got[a.ID].Payload != nil {
		t.Fatalf("Events = %v, want a and b, SENT, without payloads", got)
	}
}
