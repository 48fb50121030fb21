package dlqreplay_test

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/projection"
)

// A projection consumer's rebuild, on real Postgres: pause, clear its
// projection (all, or one aggregate type) and inbox, seek, resume. Then the
// messages the seek redelivers (handed to the consumer's own engine here:
// pstest's Seek is broken and the emulator has none, so the seek request is
// checked as Pub/Sub receives it) are applied again, not answered as
// duplicates, and the projection equals the one before. The dry run
// changes nothing; a time the subscription's retention cannot reach is
// refused before anything changes.
func TestRebuildAProjection(t *testing.T) {
	ctx := context.Background()
	full, fullSibling := "projects/"+pubsubtest.Project+"/subscriptions/"+sub, "projects/"+pubsubtest.Project+"/subscriptions/"+sibling
	e := newEnv(t, dlqreplay.AuthNone, "")
	rec := &seekRecorder{}
	fake := pubsubtest.New(t, pstest.ServerReactorOption{FuncName: "Seek", Reactor: rec})
	fake.Provision(t, e.top)
	admin := fake.Client.PubSub().SubscriptionAdminClient
	target := pushAttached(t, fake)
	e = newHandler(t, e, func(o *dlqreplay.Options) {
		behindCloudRun(o)
		o.Broker = fake.Client
		o.PushTargets = map[string]dlqreplay.PushTarget{sub: target, sibling: target}
	})
	alice, bob := bearerOf(person("alice@example.com")), bearerOf(person("bob@example.com"))

	eng := auditEngine(t, e, fake.Client)
	var msgs []event.Message
	for _, a := range []struct {
		typ, id string
		n       int64
	}{{"member", "m-1", 3}, {"member", "m-2", 2}, {"bonus", "b-1", 2}} {
		for v := int64(1); v <= a.n; v++ {
			ev := &event.Event{ID: fmt.Sprintf("evt-%s-%d", a.id, v), Type: "points.added", Source: "member-service", Topic: "member.points.events",
				AggregateType: a.typ, AggregateID: a.id, Version: v, Payload: []byte(fmt.Sprintf(`{"points":%d}`, 10*v))}
			if err := ev.Prepare(time.Now(), event.Limits{}); err != nil {
				t.Fatal(err)
			}
			m, err := cloudevent.Encode(ev, event.EncodingJSON)
			if err != nil {
				t.Fatal(err)
			}
			m.ID = "m-" + ev.ID
			msgs = append(msgs, m)
		}
	}
	deliver := func(wantDuplicate bool) {
		t.Helper()
		for _, m := range msgs {
			res := eng.Handle(ctx, delivery.Delivery{Mode: delivery.ModePush, Subscription: full, Message: m})
			if res.Status != http.StatusOK || res.Duplicate != wantDuplicate {
				t.Fatalf("deliver %s: %+v (want duplicate %v)", m.ID, res, wantDuplicate)
			}
		}
	}
	projectionRows := func() map[string]string { return auditProjection(t, e) }
	count := func(table string) int { return auditRows(t, e, table) }
	deliver(false)
	before := projectionRows()
	if len(before) != 3 || count("relaybus_inbox") != 7 {
		t.Fatalf("before: projection %v, inbox %d", before, count("relaybus_inbox"))
	}
	base := "/consumers/member.points.events/audit-service:rebuild"
	hourAgo := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)

	runAuth(t, e, []authCase{
		{name: "beyond the retention", method: "POST", path: base, headers: alice, body: map[string]any{"time": time.Now().Add(-8 * 24 * time.Hour).UTC().Format(time.RFC3339)}, want: 409, code: "retention"},
		{name: "no time nor snapshot", method: "POST", path: base, headers: alice, body: map[string]any{}, want: 400, code: "invalid_argument"},
		{name: "a reader may not rebuild", method: "POST", path: base, headers: bob, body: map[string]any{"time": hourAgo}, want: 403, code: "forbidden"},
		{name: "a snapshot for two topics", method: "POST", path: base, headers: alice, body: map[string]any{"snapshot": "before"}, want: 409, code: "snapshot"},
		{name: "its own tables", method: "POST", path: "/consumers/shop.order.events/member-service:rebuild", headers: alice, body: map[string]any{"time": hourAgo}, want: 409, code: "handler"},
	})
	var dry map[string]any
	if code := e.callWith(t, "POST", base, bob, map[string]any{"time": hourAgo, "dryRun": true}, &dry); code != 200 {
		t.Fatalf("dry run: %d %v", code, dry)
	}
	if w := dry["wouldClear"].(map[string]any); w["projectionRows"] != 3.0 || w["inboxRows"] != 7.0 {
		t.Errorf("dry run would clear %v, want 3 projection rows and 7 inbox rows", w)
	}
	if subs := fmt.Sprint(dry["subscriptions"]); subs != "["+sub+" "+sibling+"]" || !strings.Contains(fmt.Sprint(dry["warning"]), "keeps one state") {
		t.Errorf("dry run: subscriptions %s, warning %v; want both of audit-service's, said", subs, dry["warning"])
	}
	if !reflect.DeepEqual(projectionRows(), before) || count("relaybus_inbox") != 7 || len(rec.reqs) != 0 {
		t.Fatal("the dry run or a refused rebuild changed something")
	}

	// All of it.
	var got map[string]any
	if code := e.callWith(t, "POST", base, alice, map[string]any{"time": hourAgo}, &got); code != 200 {
		t.Fatalf("rebuild: %d %v", code, got)
	}
	if len(projectionRows()) != 0 || count("relaybus_inbox") != 0 {
		t.Fatalf("after the rebuild's clear: projection %v, inbox %d", projectionRows(), count("relaybus_inbox"))
	}
	if len(rec.reqs) != 2 || rec.reqs[0].GetSubscription() != full || rec.reqs[1].GetSubscription() != fullSibling ||
		rec.reqs[0].GetTime().AsTime().Format(time.RFC3339) != hourAgo || rec.reqs[1].GetTime().AsTime().Format(time.RFC3339) != hourAgo {
		t.Fatalf("seek requests %v, want %s and %s to %s", rec.reqs, full, fullSibling, hourAgo)
	}
	for _, name := range []string{full, fullSibling} {
		s, err := admin.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: name})
		if err != nil {
			t.Fatal(err)
		}
		if s.GetPushConfig().GetPushEndpoint() != target.Endpoint || got["resumed"] != true {
			t.Fatalf("after the rebuild %s pushes to %q (resumed %v)", name, s.GetPushConfig().GetPushEndpoint(), got["resumed"])
		}
	}
	rec.reqs = nil
	deliver(false) // what the seek redelivers is applied, not a duplicate
	if after := projectionRows(); !reflect.DeepEqual(after, before) {
		t.Fatalf("rebuilt projection %v, want %v", after, before)
	}

	// One aggregate type: only its rows go; every event is redelivered,
	// and the kept aggregates' version gate ignores theirs.
	if code := e.callWith(t, "POST", base, alice, map[string]any{"time": hourAgo, "aggregateType": "bonus"}, &got); code != 200 {
		t.Fatalf("scoped rebuild: %d %v", code, got)
	}
	if rows := projectionRows(); len(rows) != 2 || rows["bonus/b-1"] != "" {
		t.Fatalf("after the scoped clear: %v, want the member rows only", rows)
	}
	deliver(false)
	if after := projectionRows(); !reflect.DeepEqual(after, before) {
		t.Fatalf("rebuilt projection %v, want %v", after, before)
	}
	entries, err := e.store.Audit().List(ctx, audit.Query{ActionPrefix: "consumer.rebuild", Outcome: audit.OutcomeSucceeded, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 || entries[0].By != "alice@example.com" {
		t.Errorf("audit %+v, want two rebuilds by alice", entries)
	}

	// A seek Pub/Sub refuses (the local stack's refuses any seek back)
	// stops the rebuild before it clears anything, and the consumer is
	// resumed: the seek comes before the clear.
	rec.mu.Lock()
	rec.refuse = status.Error(codes.FailedPrecondition, "cannot seek back")
	rec.mu.Unlock()
	var refused map[string]string
	if code := e.callWith(t, "POST", base, alice, map[string]any{"time": hourAgo}, &refused); code != http.StatusConflict ||
		refused["code"] != "refused" || !strings.Contains(refused["message"], "nothing was cleared") {
		t.Fatalf("rebuild with a refused seek: %d %v, want 409 refused saying nothing was cleared", code, refused)
	}
	if after := projectionRows(); !reflect.DeepEqual(after, before) || count("relaybus_inbox") != 7 {
		t.Fatalf("a rebuild whose seek was refused left projection %v and %d inbox rows, want them as before", after, count("relaybus_inbox"))
	}
	for _, name := range []string{full, fullSibling} {
		s, err := admin.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: name})
		if err != nil {
			t.Fatal(err)
		}
		if s.GetPushConfig().GetPushEndpoint() != target.Endpoint {
			t.Fatalf("after a refused rebuild %s pushes to %q, want it resumed", name, s.GetPushConfig().GetPushEndpoint())
		}
	}
}

// audit-service's two subscriptions: it records points (projection) and
// notifications (strict) in the same database, so its state is the same
// rows and a rebuild of one rebuilds both.
const (
	sub     = "member.points.events.audit-service-recorder"
	sibling = "message.notification.events.audit-service-recorder"
)

// pushAttached gives audit-service's subscriptions on fake their push
// endpoint, as Terraform deploys them, and returns the target dlqreplay is
// told (DLQREPLAY_PUSH_TARGETS) to resume them with.
func pushAttached(t *testing.T, fake *pubsubtest.Fake) dlqreplay.PushTarget {
	t.Helper()
	target := dlqreplay.PushTarget{Endpoint: "https://consume-audit-service-recorder-0a1b2c3d-ew.a.run.app",
		ServiceAccount: "rb-consume-0a1b2c3d4e5f@relaybus-test.iam.gserviceaccount.com", Audience: "https://consume-audit-service-recorder-0a1b2c3d-ew.a.run.app"}
	for _, id := range []string{sub, sibling} {
		if _, err := fake.Client.PubSub().SubscriptionAdminClient.UpdateSubscription(context.Background(), &pb.UpdateSubscriptionRequest{
			Subscription: &pb.Subscription{Name: "projects/" + pubsubtest.Project + "/subscriptions/" + id, PushConfig: &pb.PushConfig{PushEndpoint: target.Endpoint,
				AuthenticationMethod: &pb.PushConfig_OidcToken_{OidcToken: &pb.PushConfig_OidcToken{ServiceAccountEmail: target.ServiceAccount, Audience: target.Audience}}}},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"push_config"}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	return target
}

// auditProjection is audit-service's projection: each aggregate's
// version, event and state.
func auditProjection(t *testing.T, e *env) map[string]string {
	t.Helper()
	rows, err := e.db.Query(context.Background(), `SELECT aggregate_type || '/' || aggregate_id, version || ' ' || event_id || ' ' || state::text FROM relaybus_projection WHERE consumer_id = 'audit-service'`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// auditRows counts audit-service's rows in table.
func auditRows(t *testing.T, e *env, table string) int {
	t.Helper()
	var n int
	if err := e.db.QueryRow(context.Background(), `SELECT count(*) FROM `+table+` WHERE consumer_id = 'audit-service'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// auditEngine is audit-service as consume runs it: the projection handler
// over e's database, its inbox and projection tables migrated.
func auditEngine(t *testing.T, e *env, dl event.Publisher) *consumer.Engine {
	t.Helper()
	ctx := context.Background()
	if err := inbox.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	if err := projection.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	eng, err := consumer.New(consumer.Options{DB: e.db, ConsumerID: "audit-service", Subscription: sub, Handler: projection.Latest(), DeadLetters: dl})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}
