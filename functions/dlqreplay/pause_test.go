package dlqreplay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/pubsubtest"
)

// Pause detaches a push consumer's endpoint (Pub/Sub then delivers
// nothing: no attempt counted, nothing dead-lettered, messages wait);
// resume restores the endpoint and OIDC identity Terraform gave it. Both
// are writes (writers only, refused read-only, audited). An Eventarc
// consumer is paused by its own flag instead (pause_eventarc_test.go);
// before its consume has created the flag's table, the pause says so and
// changes nothing.
func TestPauseAndResumeAPushConsumer(t *testing.T) {
	ctx := context.Background()
	sub := "member.points.events.audit-service-recorder"
	target := dlqreplay.PushTarget{Endpoint: "https://consume-audit-service-recorder-0a1b2c3d-ew.a.run.app",
		ServiceAccount: "rb-consume-0a1b2c3d4e5f@relaybus-test.iam.gserviceaccount.com", Audience: "https://consume-audit-service-recorder-0a1b2c3d-ew.a.run.app"}
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		behindCloudRun(o)
		o.PushTargets = map[string]dlqreplay.PushTarget{sub: target}
	})
	admin := e.fake.Client.PubSub().SubscriptionAdminClient
	full := "projects/" + pubsubtest.Project + "/subscriptions/" + sub
	// As Terraform creates it: a push subscription to the consume service.
	if _, err := admin.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: full, PushConfig: &pb.PushConfig{PushEndpoint: target.Endpoint,
			AuthenticationMethod: &pb.PushConfig_OidcToken_{OidcToken: &pb.PushConfig_OidcToken{ServiceAccountEmail: target.ServiceAccount, Audience: target.Audience}}}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"push_config"}},
	}); err != nil {
		t.Fatal(err)
	}
	e = newHandler(t, e, func(o *dlqreplay.Options) {
		behindCloudRun(o)
		o.PushTargets = map[string]dlqreplay.PushTarget{sub: target}
		o.Broker = e.fake.Client
	})
	pushConfig := func() *pb.PushConfig {
		s, err := admin.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: full})
		if err != nil {
			t.Fatal(err)
		}
		return s.GetPushConfig()
	}
	base := "/consumers/member.points.events/audit-service"
	alice, bob := bearerOf(person("alice@example.com")), bearerOf(person("bob@example.com"))
	runAuth(t, e, []authCase{
		{name: "a reader may not pause", method: "POST", path: base + ":pause", headers: bob, want: 403, code: "forbidden"},
		{name: "an Eventarc consumer not migrated yet", method: "POST", path: "/consumers/shop.order.events/message-service:pause", headers: alice, want: 409, code: "not_migrated"},
		{name: "undeclared", method: "POST", path: "/consumers/shop.order.events/nobody:pause", headers: alice, want: 404, code: "not_found"},
		{name: "a body is refused", method: "POST", path: base + ":pause", headers: alice, body: map[string]any{"x": 1}, want: 400, code: "invalid_argument"},
	})
	if got := pushConfig().GetPushEndpoint(); got != target.Endpoint {
		t.Fatalf("refused calls changed the push endpoint to %q", got)
	}

	var st map[string]any
	if code := e.callWith(t, "POST", base+":pause", alice, nil, &st); code != 200 || st["paused"] != true || st["changed"] != true || st["control"] != dlqreplay.ControlPushEndpoint {
		t.Fatalf("pause: %d %v", code, st)
	}
	if pc := pushConfig(); pc.GetPushEndpoint() != "" {
		t.Fatalf("paused, the subscription still pushes to %q", pc.GetPushEndpoint())
	}
	if code := e.callWith(t, "POST", base+":pause", alice, nil, &st); code != 200 || st["changed"] != false {
		t.Errorf("pausing again: %d %v, want unchanged", code, st)
	}
	if code := e.callWith(t, "GET", base+"/delivery", bob, nil, &st); code != 200 || st["paused"] != true {
		t.Errorf("delivery while paused: %d %v", code, st)
	}
	var list struct {
		Consumers []struct {
			Topic, ConsumerID string
			Paused            *bool
		}
	}
	if code := e.callWith(t, "GET", "/consumers", bob, nil, &list); code != 200 {
		t.Fatalf("list: %d", code)
	}
	for _, c := range list.Consumers {
		if c.Topic == "member.points.events" && c.ConsumerID == "audit-service" && (c.Paused == nil || !*c.Paused) {
			t.Errorf("the registry listing does not show audit-service paused: %v", c.Paused)
		}
		if c.ConsumerID == "message-service" && c.Paused != nil {
			t.Errorf("an Eventarc consumer shows a paused state")
		}
	}

	if code := e.callWith(t, "POST", base+":resume", alice, nil, &st); code != 200 || st["paused"] != false || st["changed"] != true {
		t.Fatalf("resume: %d %v", code, st)
	}
	pc := pushConfig()
	if pc.GetPushEndpoint() != target.Endpoint || pc.GetOidcToken().GetServiceAccountEmail() != target.ServiceAccount || pc.GetOidcToken().GetAudience() != target.Audience {
		t.Fatalf("resumed push config %v, want %+v", pc, target)
	}

	entries, err := e.store.Audit().List(ctx, audit.Query{ActionPrefix: "consumer.", Outcome: audit.OutcomeSucceeded, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	// Every call is recorded, the repeated pause too (it changed nothing).
	if len(entries) != 3 || entries[0].Action != "consumer.resume" || entries[2].Action != "consumer.pause" || entries[2].By != "alice@example.com" ||
		entries[1].Detail != "already paused: nothing changed" {
		t.Errorf("audit %+v, want pause, pause (nothing changed), resume by alice", entries)
	}

	ro := newHandler(t, e, func(o *dlqreplay.Options) {
		o.ReadOnly = true
		o.Broker = e.fake.Client
	})
	runAuth(t, ro, []authCase{{name: "read-only", method: "POST", path: base + ":pause", want: 403, code: "read_only"}})
	if got := pushConfig().GetPushEndpoint(); got != target.Endpoint {
		t.Errorf("a refused pause detached the endpoint (%q)", got)
	}
}

// A consumer deployed in pull mode (Terraform's pull_mode) is declared
// push but has no push endpoint: pause answered {"paused": true,
// "changed": false} while its worker kept pulling. On Pub/Sub too it is
// paused by its own flag, which its worker reads (the worker stopping is
// observed in TestPauseResumeAndRebuildAPullConsumerOnNATS, with the same
// worker and engine): the answers say how, the flag is in its database,
// and the delivery state reads it.
func TestPullConsumersArePausedByTheirFlag(t *testing.T) {
	ctx := context.Background()
	sub := "member.points.events.audit-service-recorder"
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		behindCloudRun(o)
		o.PullConsumers = []string{sub}
	})
	e = newHandler(t, e, func(o *dlqreplay.Options) {
		behindCloudRun(o)
		o.PullConsumers = []string{sub}
		o.Broker = e.fake.Client
	})
	if err := inbox.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	base := "/consumers/member.points.events/audit-service"
	alice := bearerOf(person("alice@example.com"))
	flag := func() int {
		var n int
		if err := e.db.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox_pause WHERE consumer_id = 'audit-service' AND topic = 'member.points.events'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var st map[string]any
	if code := e.callWith(t, "POST", base+":pause", alice, nil, &st); code != 200 || st["paused"] != true || st["changed"] != true ||
		st["control"] != dlqreplay.ControlConsumerFlag || st["delivery"] != "pull" || !strings.Contains(fmt.Sprint(st["done"]), "stops pulling") {
		t.Fatalf("pause: %d %v", code, st)
	}
	if flag() != 1 {
		t.Fatalf("paused, and no flag in the consumer's database")
	}
	if code := e.callWith(t, "GET", base+"/delivery", alice, nil, &st); code != 200 || st["delivery"] != "pull" || st["paused"] != true {
		t.Errorf("delivery state of a paused pull consumer: %d %v", code, st)
	}
	if code := e.callWith(t, "POST", base+":resume", alice, nil, &st); code != 200 || st["paused"] != false || st["changed"] != true {
		t.Fatalf("resume: %d %v", code, st)
	}
	if flag() != 0 {
		t.Errorf("resumed, and the flag stands")
	}
	if code := e.callWith(t, "GET", base+"/delivery", alice, nil, &st); code != 200 || st["paused"] != false {
		t.Errorf("delivery state after the resume: %d %v", code, st)
	}
}
