package dlqreplay_test

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/pack"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

// A rebuild from the event history, end to end on Pub/Sub (pstest): events
// published through the outbox and a relay, taken from the consumer's
// subscription and applied; half of them then moved to the history by
// retention. The rebuild pauses audit-service, starts a backfill per
// subscription, clears its projection and inbox and resumes it; driving
// the backfills and a relay drain sends every event again through Pub/Sub,
// addressed to audit-service alone, and what its subscription delivers is
// applied again (not a duplicate) until the projection equals the one
// before. No seek is involved, so the redelivery is observed here, not
// simulated.
func TestRebuildFromTheHistoryRedelivers(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, dlqreplay.AuthNone, "")
	target := pushAttached(t, e.fake)
	e = newHandler(t, e, func(o *dlqreplay.Options) {
		behindCloudRun(o)
		o.Broker = e.fake.Client
		o.PushTargets = map[string]dlqreplay.PushTarget{sub: target, sibling: target}
	})
	alice, bob := bearerOf(person("alice@example.com")), bearerOf(person("bob@example.com"))
	eng := auditEngine(t, e, e.fake.Client)
	drain := func() { t.Helper(); drainOutbox(t, e.db, e.fake.Client, e.top) }
	// take pulls audit-service's subscription until n events were
	// applied, each message acknowledged after its answer, and returns
	// them (a pack's each).
	take := func(n int) []event.Message {
		t.Helper()
		tctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		var got []event.Message
		for len(got) < n {
			leases, err := e.fake.Client.Pull(tctx, sub, n-len(got))
			if err != nil {
				t.Fatalf("pull after %d of %d messages: %v", len(got), n, err)
			}
			for _, l := range leases {
				m := l.Message()
				res := eng.Handle(ctx, delivery.Delivery{Mode: delivery.ModePush, Subscription: sub, Message: m})
				if res.Status != http.StatusOK || res.Duplicate {
					t.Fatalf("delivery of %s: %+v, want applied", m.Attributes[event.AttrEventID], res)
				}
				if err := l.Ack(ctx); err != nil {
					t.Fatal(err)
				}
				if !pack.Is(m) {
					got = append(got, m)
					continue
				}
				inner, err := pack.Decode(m)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, inner...)
			}
		}
		return got
	}

	var evs []*event.Event
	for _, a := range []struct {
		typ, id string
		n       int64
	}{{"member", "m-1", 3}, {"member", "m-2", 2}, {"bonus", "b-1", 2}} {
		for v := int64(1); v <= a.n; v++ {
			evs = append(evs, &event.Event{ID: fmt.Sprintf("evt-%s-%d", a.id, v), Type: "points.added", Source: "member-service", Topic: "member.points.events",
				AggregateType: a.typ, AggregateID: a.id, Version: v, Payload: []byte(fmt.Sprintf(`{"points":%d}`, 10*v))})
		}
	}
	if _, err := outbox.Enqueue(ctx, e.db, evs...); err != nil {
		t.Fatal(err)
	}
	drain()
	take(len(evs))
	before := auditProjection(t, e)
	if len(before) != 3 || auditRows(t, e, "relaybus_inbox") != 7 {
		t.Fatalf("before: projection %v, inbox %d", before, auditRows(t, e, "relaybus_inbox"))
	}
	// Retention moves four of the seven events to the history.
	if _, err := outbox.PurgeWith(ctx, e.db, outbox.PurgeOptions{Before: time.Now().Add(time.Minute), Limit: 4, History: outbox.History{Default: time.Hour}}); err != nil {
		t.Fatal(err)
	}

	base := "/consumers/member.points.events/audit-service:rebuild"
	hourAgo := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	runAuth(t, e, []authCase{
		{name: "a snapshot from the history", method: "POST", path: base, headers: alice, body: map[string]any{"history": true, "snapshot": "before"}, want: 400, code: "invalid_argument"},
		{name: "a rate without the history", method: "POST", path: base, headers: alice, body: map[string]any{"time": hourAgo, "rate": 10}, want: 400, code: "invalid_argument"},
		{name: "an unknown outbox database", method: "POST", path: base, headers: alice, body: map[string]any{"history": true, "time": hourAgo, "database": "nowhere"}, want: 400, code: "invalid_argument"},
		{name: "a reader may not rebuild", method: "POST", path: base, headers: bob, body: map[string]any{"history": true, "time": hourAgo}, want: 403, code: "forbidden"},
		{name: "older than the history keeps (90 days)", method: "POST", path: base, headers: alice,
			body: map[string]any{"history": true, "time": time.Now().Add(-91 * 24 * time.Hour).UTC().Format(time.RFC3339)}, want: 409, code: "retention"},
	})
	var dry map[string]any
	if code := e.callWith(t, "POST", base, bob, map[string]any{"history": true, "time": hourAgo, "dryRun": true}, &dry); code != 200 {
		t.Fatalf("dry run: %d %v", code, dry)
	}
	if w, r := dry["wouldClear"].(map[string]any), dry["wouldReplay"].(map[string]any); w["projectionRows"] != 3.0 || w["inboxRows"] != 7.0 ||
		r["member.points.events"] != 7.0 || r["message.notification.events"] != 0.0 {
		t.Fatalf("dry run would clear %v and replay %v; want 3 projection rows and 7 inbox rows cleared, 7 and 0 events replayed", w, r)
	}
	if !reflect.DeepEqual(auditProjection(t, e), before) || auditRows(t, e, "relaybus_inbox") != 7 {
		t.Fatal("the dry run or a refused rebuild changed something")
	}

	var got map[string]any
	if code := e.callWith(t, "POST", base, alice, map[string]any{"history": true, "time": hourAgo}, &got); code != 200 {
		t.Fatalf("rebuild: %d %v", code, got)
	}
	if len(auditProjection(t, e)) != 0 || auditRows(t, e, "relaybus_inbox") != 0 || got["resumed"] != true {
		t.Fatalf("after the rebuild: projection %v, inbox %d, resumed %v", auditProjection(t, e), auditRows(t, e, "relaybus_inbox"), got["resumed"])
	}
	for _, id := range []string{sub, sibling} {
		s, err := e.fake.Client.PubSub().SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: "projects/" + pubsubtest.Project + "/subscriptions/" + id})
		if err != nil {
			t.Fatal(err)
		}
		if s.GetPushConfig().GetPushEndpoint() != target.Endpoint {
			t.Fatalf("after the rebuild %s pushes to %q, want it resumed", id, s.GetPushConfig().GetPushEndpoint())
		}
	}
	bfs, _ := got["backfills"].([]any)
	if len(bfs) != 2 {
		t.Fatalf("rebuild answered backfills %v, want one per subscription", got["backfills"])
	}
	for _, b := range bfs {
		id := b.(map[string]any)["id"].(string)
		var run map[string]any
		if code := e.callWith(t, "POST", "/backfills/"+id+":run", alice, nil, &run); code != 200 || run["state"] != "done" {
			t.Fatalf("drive backfill %s: %d %v", id, code, run)
		}
	}
	drain()
	redelivered := take(len(evs))
	var ids []string
	for _, m := range redelivered {
		if m.Attributes[topology.TargetConsumerAttr] != "audit-service" {
			t.Errorf("redelivered %s addressed to %q, want audit-service alone", m.Attributes[event.AttrEventID], m.Attributes[topology.TargetConsumerAttr])
		}
		ids = append(ids, m.Attributes[event.AttrEventID])
	}
	slices.Sort(ids)
	want := make([]string, 0, len(evs))
	for _, ev := range evs {
		want = append(want, ev.ID)
	}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("redelivered %v, want every event once: %v", ids, want)
	}
	if after := auditProjection(t, e); !reflect.DeepEqual(after, before) {
		t.Fatalf("rebuilt projection %v, want %v", after, before)
	}

	entries, err := e.store.Audit().List(ctx, audit.Query{ActionPrefix: "consumer.rebuild", Outcome: audit.OutcomeSucceeded, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].By != "alice@example.com" || !strings.Contains(entries[0].Detail, "from the history") {
		t.Errorf("audit %+v, want alice's rebuild from the history", entries)
	}
}
