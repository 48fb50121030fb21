package infra

import (
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/zclconf/go-cty/cty"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/shared/topology"
)

// grant is one evaluated instance of an *_iam_member resource.
type grant struct {
	resource, target, role, member string
}

// grantsOf evaluates every instance of every resource of an *_iam_member
// type, with target the value of its targetAttr (topic, secret_id, ...).
// Resources with count are evaluated when count is a plain number.
func grantsOf(t *testing.T, c *tfConfig, ev *evaluator, typ, targetAttr string) []grant {
	t.Helper()
	stubs := resourceStubs(t, ev)
	var out []grant
	for _, key := range c.resourcesOfType(typ) {
		b := c.resources[key]
		instances := map[string]cty.Value{"": cty.NilVal}
		if _, ok := b.Body.Attributes["for_each"]; ok {
			instances = forEachKeys(t, ev, b)
		} else if a, ok := b.Body.Attributes["count"]; ok {
			n, diags := ev.eval(a.Expr, stubs)
			if diags.HasErrors() {
				t.Fatalf("%s count: %s", key, diags.Error())
			}
			instances = map[string]cty.Value{}
			count, _ := n.AsBigFloat().Int64()
			for i := int64(0); i < count; i++ {
				instances[strconv.FormatInt(i, 10)] = cty.NumberIntVal(i)
			}
		}
		for k, v := range instances {
			in := newInstance(t, ev, stubs, key, k, v)
			if v != cty.NilVal && v.Type() == cty.Number {
				in.extra["count"] = cty.ObjectVal(map[string]cty.Value{"index": v})
			}
			out = append(out, grant{
				resource: key + "[" + k + "]",
				target:   in.attr(b.Body, targetAttr).AsString(),
				role:     in.attr(b.Body, "role").AsString(),
				member:   in.attr(b.Body, "member").AsString(),
			})
		}
	}
	return out
}

func consumeMember(ev *evaluator, sub string) string {
	acct := ev.local("consumers").GetAttr(sub).GetAttr("account_id").AsString()
	return "serviceAccount:" + acct + "@relaybus-test.iam.gserviceaccount.com"
}

// TestConsumersPublishTheirChildEvents: every consume service account is a
// Pub/Sub publisher on exactly the topics it writes: the rollup topic, its
// topic's <topic>.dlq and the topics its handler emits child events to
// (the topology's emits). Each consume service kicks its children right
// after its transaction commits, as its own account; with publisher on the
// rollup and dead-letter topics only, every kick in production got
// PermissionDenied and the children waited for the next Scheduler drain.
func TestConsumersPublishTheirChildEvents(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		got := map[string][]string{} // member -> topics it may publish to
		for _, g := range grantsOf(t, c, ev, "google_pubsub_topic_iam_member", "topic") {
			if g.role == "roles/pubsub.publisher" {
				got[g.member] = append(got[g.member], g.target)
			}
		}
		emitting := 0
		for _, cs := range top.Consumers() {
			want := append([]string{top.Rollup.Topic, cs.DeadLetterTopic()}, cs.Emits...)
			if cs.Handler == topology.HandlerForward && cs.Delivery == topology.DeliveryEventarc && cs.ForwardBreakerThreshold >= 0 && !slices.Contains(want, cs.Topic) {
				// Its breaker's resume publishes what the pause kept to its
				// own topic (functions/consume/breakerflag.go).
				want = append(want, cs.Topic)
			}
			sort.Strings(want)
			have := append([]string(nil), got[consumeMember(ev, cs.Subscription())]...)
			sort.Strings(have)
			if strings.Join(have, ",") != strings.Join(want, ",") {
				t.Errorf("consume %s (emits %v) publishes to %v, want %v", cs.Subscription(), cs.Emits, have, want)
			}
			if len(cs.Emits) > 0 {
				emitting++
			}
		}
		if t.Name() == "TestConsumersPublishTheirChildEvents/infra/topology.yaml" && emitting == 0 {
			t.Error("the repository's topology declares no emits, though its example handlers emit child events")
		}
	})
}

// TestDlqreplayReadsEveryDatabase: dlqreplay gets every database's URL
// (DATABASE_URL and DATABASE_URL_<NAME>) from its secret and may read each
// secret; with main only, a consumer with its own database got a replay dry
// run of "unknown" and an event page without its outbox state.
func TestDlqreplayReadsEveryDatabase(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		dbs := jsonValue(t, ev.local("function_databases")).(map[string]any)["dlqreplay"].(map[string]any)
		secretIDs := jsonValue(t, ev.local("role_secret_ids")).(map[string]any)
		readable := map[string]bool{}
		for _, g := range grantsOf(t, c, ev, "google_secret_manager_secret_iam_member", "secret_id") {
			if g.role == "roles/secretmanager.secretAccessor" && g.member == "serviceAccount:relaybus-dlqreplay@relaybus-test.iam.gserviceaccount.com" {
				readable[g.target] = true
			}
		}
		for _, d := range top.Databases {
			if dbs[d.EnvVar()] != d.Name {
				t.Errorf("dlqreplay: %s is %v, want the %s database's secret", d.EnvVar(), dbs[d.EnvVar()], d.Name)
			}
			if id, _ := secretIDs[d.Name+"/dlqreplay"].(string); !readable[id] {
				t.Errorf("dlqreplay may not read its role's URL secret on %s, %v", d.Name, secretIDs[d.Name+"/dlqreplay"])
			}
		}
		if len(dbs) != len(top.Databases) {
			t.Errorf("dlqreplay databases %v, want the topology's %d", dbs, len(top.Databases))
		}
	})
}

// TestLogMetricAlertsWaitTenMinutes: the alert policies that read a
// log-based metric wait (time_sleep.log_metrics) at least 10 minutes by
// default, and var.propagation_waits refuses less: Monitoring answers a
// policy on a new metric with 404 "If a metric was created recently, it
// could take up to 10 minutes to become available"
// (https://github.com/hashicorp/terraform-provider-google/issues/11102).
func TestLogMetricAlertsWaitTenMinutes(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	ev := c.newEvaluator(t, requiredVars(t))
	wait := c.resource(t, "time_sleep.log_metrics")
	d, diags := ev.eval(wait.Body.Attributes["create_duration"].Expr, nil)
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	secs, err := strconv.Atoi(strings.TrimSuffix(d.AsString(), "s"))
	if err != nil || !strings.HasSuffix(d.AsString(), "s") {
		t.Fatalf("time_sleep.log_metrics create_duration %q: want whole seconds", d.AsString())
	}
	if secs < 600 {
		t.Errorf("the alert policies wait %ds for a new log-based metric; Monitoring says it may take up to 10 minutes", secs)
	}
	cond := block(t, "variable propagation_waits", c.variables["propagation_waits"].Body, "validation").Attributes["condition"].Expr
	for value, want := range map[string]bool{"300s": false, "599s": false, "600s": true, "660s": true, "10m": false, "abc": false} {
		ev2 := c.newEvaluator(t, map[string]cty.Value{"propagation_waits": cty.ObjectVal(map[string]cty.Value{"log_metrics": cty.StringVal(value)})})
		got, diags := ev2.eval(cond, nil)
		if diags.HasErrors() {
			t.Fatalf("log_metrics = %q: %s", value, diags.Error())
		}
		if got.True() != want {
			t.Errorf("propagation_waits.log_metrics = %q: accepted %v, want %v", value, got.True(), want)
		}
	}
}

// TestGapAlertNamesAReachableRoute: the gap alert tells operators how to
// list and skip gaps through dlqreplay (the relaybus CLI), not through the
// consume service, whose internal ingress refuses them (Cloud Run: with
// Internal, "Requests from other sources, including the internet, cannot
// reach your service").
func TestGapAlertNamesAReachableRoute(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	ev := c.newEvaluator(t, requiredVars(t)).withStubs()
	doc := block(t, "strict_gaps", c.resource(t, "google_monitoring_alert_policy.strict_gaps").Body, "documentation")
	v, diags := ev.eval(doc.Attributes["content"].Expr, nil)
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	text := v.AsString()
	for _, want := range []string{"relaybus -url <dlqreplay URL> -gcloud-auth gaps ls", "relaybus gaps skip", "/consumers/<topic>/<consumer>/gaps"} {
		if !strings.Contains(text, want) {
			t.Errorf("the gap alert's documentation does not say %q: %s", want, text)
		}
	}
	if strings.Contains(text, "consume URL") {
		t.Errorf("the gap alert sends operators to the consume service, which is internal-only: %s", text)
	}
	if got := c.exprSource(c.resource(t, "google_cloud_run_v2_service.consume").Body.Attributes["ingress"].Expr); got != `"INGRESS_TRAFFIC_INTERNAL_ONLY"` {
		t.Errorf("consume ingress %s", got)
	}
}

// TestBreakerAlert: a forward target down raises an alert that reads the
// breaker's log-based metric per consumer, waits for the metric to reach
// Monitoring (its id among time_sleep.log_metrics' triggers), and tells
// the operator what happened and what to do through dlqreplay (the relaybus
// CLI), not through the internal-only consume service.
func TestBreakerAlert(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	ev := c.newEvaluator(t, requiredVars(t)).withStubs()
	policy := c.resource(t, "google_monitoring_alert_policy.forward_breaker")
	cond := block(t, "forward_breaker", block(t, "forward_breaker", policy.Body, "conditions"), "condition_threshold")
	if got := c.exprSource(cond.Attributes["filter"].Expr); !strings.Contains(got, "google_logging_metric.forward_breaker_down.name") {
		t.Errorf("the breaker alert's filter %s does not read the breaker's log-based metric", got)
	}
	agg := block(t, "forward_breaker", cond, "aggregations")
	if got := c.exprSource(agg.Attributes["group_by_fields"].Expr); !strings.Contains(got, "metric.label.consumer_id") {
		t.Errorf("the breaker alert groups by %s; want one incident per consumer (metric.label.consumer_id)", got)
	}
	metric := c.resource(t, "google_logging_metric.forward_breaker_down")
	if got := c.exprSource(metric.Body.Attributes["label_extractors"].Expr); !strings.Contains(got, "EXTRACT(jsonPayload.consumer_id)") {
		t.Errorf("the breaker metric's label extractors %s: want consumer_id from the log line", got)
	}
	triggers := c.exprSource(c.resource(t, "time_sleep.log_metrics").Body.Attributes["triggers"].Expr)
	if !strings.Contains(triggers, "google_logging_metric.forward_breaker_down.id") {
		t.Errorf("time_sleep.log_metrics does not wait for the breaker's metric: %s", triggers)
	}
	if !contains(dependsOn(t, policy), "time_sleep.log_metrics") {
		t.Error("the breaker alert does not wait for time_sleep.log_metrics")
	}
	doc := block(t, "forward_breaker", policy.Body, "documentation")
	v, diags := ev.eval(doc.Attributes["content"].Expr, nil)
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	text := v.AsString()
	for _, want := range []string{"consumer_id", "Fix the target", "relaybus -url <dlqreplay URL> -gcloud-auth consumers ls",
		"relaybus consumers pause", "relaybus consumers resume", "docs/forwarding.md", "nothing is dead-lettered"} {
		if !strings.Contains(text, want) {
			t.Errorf("the breaker alert's documentation does not say %q: %s", want, text)
		}
	}
	if strings.Contains(text, "consume URL") || strings.Contains(text, "/breaker:probe") {
		t.Errorf("the breaker alert sends operators to the consume service, which is internal-only: %s", text)
	}
}

// TestPauseResumeWiring: what dlqreplay's resume sets back
// (DLQREPLAY_PUSH_TARGETS) is exactly each push subscription's push_config
// as Terraform creates it; Terraform then leaves push_config alone (a
// deploy does not resume a paused consumer); dlqreplay may update those
// subscriptions and act as their push identities, and nothing else.
func TestPauseResumeWiring(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		stubs := resourceStubs(t, ev)
		wired := jsonValue(t, ev.local("function_wired_env")).(map[string]any)["dlqreplay"].(map[string]any)
		var targets map[string]dlqreplay.PushTarget
		raw, _ := wired["DLQREPLAY_PUSH_TARGETS"].(string)
		targets, err := dlqreplay.ParsePushTargets(raw)
		if err != nil {
			t.Fatal(err)
		}
		b := c.resource(t, "google_pubsub_subscription.consumer")
		subs := forEachKeys(t, ev, b)
		if len(targets) != len(subs) {
			t.Errorf("%d push targets for %d push subscriptions", len(targets), len(subs))
		}
		for key, v := range subs {
			in := newInstance(t, ev, stubs, "consumer", key, v)
			pc := block(t, key, b.Body, "push_config")
			oidc := block(t, key, pc, "oidc_token")
			want := dlqreplay.PushTarget{Endpoint: in.attr(pc, "push_endpoint").AsString(),
				ServiceAccount: in.attr(oidc, "service_account_email").AsString(), Audience: in.attr(oidc, "audience").AsString()}
			if targets[key] != want {
				t.Errorf("%s: resume would set %+v, Terraform creates %+v", key, targets[key], want)
			}
		}
		lc := block(t, "google_pubsub_subscription.consumer", b.Body, "lifecycle")
		if got := c.exprSource(lc.Attributes["ignore_changes"].Expr); got != "[push_config]" {
			t.Errorf("push subscriptions ignore_changes %s: a deploy would resume paused consumers", got)
		}
		dlq := "serviceAccount:relaybus-dlqreplay@relaybus-test.iam.gserviceaccount.com"
		control := map[string]bool{}
		for _, g := range grantsOf(t, c, ev, "google_pubsub_subscription_iam_member", "subscription") {
			if g.member == dlq && g.role == stubProject+"/roles/relaybusPushControl" {
				control[g.target] = true
			}
		}
		actAs := map[string]bool{}
		for _, g := range grantsOf(t, c, ev, "google_service_account_iam_member", "service_account_id") {
			if g.member == dlq && g.role == "roles/iam.serviceAccountUser" {
				actAs[g.target] = true
			}
		}
		for key := range subs {
			if !control[key] {
				t.Errorf("dlqreplay may not update %s's push config", key)
			}
			if !actAs[stubProject+"/serviceAccounts/"+targets[key].ServiceAccount] {
				t.Errorf("dlqreplay may not act as %s (resume sets it as the push identity)", targets[key].ServiceAccount)
			}
		}
		if len(control) != len(subs) || len(actAs) != len(subs) {
			t.Errorf("dlqreplay controls %d subscriptions and acts as %d accounts, want the %d push consumers'", len(control), len(actAs), len(subs))
		}

		// A forward push consumer's breaker pauses and resumes its own
		// subscription: its account has push control there and nowhere
		// else, and may act as itself (its push identity); no other
		// consume account has either.
		want := map[string]bool{}
		for _, cs := range top.Consumers() {
			if _, push := subs[cs.Subscription()]; push && cs.Handler == topology.HandlerForward && cs.ForwardBreakerThreshold >= 0 {
				want[cs.Subscription()] = true
			}
		}
		consumeControl := map[string]string{}
		for _, g := range grantsOf(t, c, ev, "google_pubsub_subscription_iam_member", "subscription") {
			if strings.Contains(g.member, "rb-consume-") && g.role == stubProject+"/roles/relaybusPushControl" {
				if g.member != consumeMember(ev, g.target) {
					t.Errorf("%s may update %s's push config: only that subscription's own consume account may", g.member, g.target)
				}
				consumeControl[g.target] = g.member
			}
		}
		consumeActAs := map[string]bool{}
		for _, g := range grantsOf(t, c, ev, "google_service_account_iam_member", "service_account_id") {
			if strings.Contains(g.member, "rb-consume-") && g.role == "roles/iam.serviceAccountUser" {
				self := strings.TrimPrefix(g.member, "serviceAccount:")
				if g.target != stubProject+"/serviceAccounts/"+self {
					t.Errorf("%s may act as %s: only as itself", g.member, g.target)
				}
				consumeActAs[self] = true
			}
		}
		for sub := range want {
			if consumeControl[sub] == "" {
				t.Errorf("%s's consume account may not pause its own push subscription (its breaker)", sub)
			}
			if !consumeActAs[strings.TrimPrefix(consumeMember(ev, sub), "serviceAccount:")] {
				t.Errorf("%s's consume account may not act as itself (the breaker's resume sets it as the push identity)", sub)
			}
		}
		if len(consumeControl) != len(want) || len(consumeActAs) != len(want) {
			t.Errorf("consume accounts control %d subscriptions and act as %d accounts, want the %d forward push consumers'", len(consumeControl), len(consumeActAs), len(want))
		}
	})
}

// TestKickFailuresReachTheAlert: a consume service's failed kick of its
// child events ("relay: publish failed; retry scheduled", logged by the
// relay it kicks with) is counted by the publish-failure metric: it used to
// be logged outside the relay's log filter, so no alert saw it.
func TestKickFailuresReachTheAlert(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		stubs := resourceStubs(t, ev)
		filter := func(name string) string {
			b := c.resource(t, "google_logging_metric."+name)
			v, diags := ev.eval(b.Body.Attributes["filter"].Expr, stubs)
			if diags.HasErrors() {
				t.Fatal(diags.Error())
			}
			return v.AsString()
		}
		runs := jsonValue(t, ev.local("consumers")).(map[string]any)
		for _, name := range []string{"publish_failures", "events_failed"} {
			f := filter(name)
			m := regexp.MustCompile(`resource\.labels\.service_name=~"([^"]+)"`).FindStringSubmatch(f)
			if m == nil {
				t.Fatalf("%s: no service name pattern in %s", name, f)
			}
			re := regexp.MustCompile(m[1])
			services := []string{"relaybus-relay", "relaybus-publish"}
			for _, cs := range runs {
				services = append(services, cs.(map[string]any)["run_service"].(string))
			}
			for _, s := range services {
				if !re.MatchString(s) {
					t.Errorf("%s does not count the publish failures of %s (%s)", name, s, m[1])
				}
			}
			for _, s := range []string{"relaybus-rollup", "relaybus-dlqreplay"} {
				if re.MatchString(s) {
					t.Errorf("%s counts %s, which publishes no outbox rows", name, s)
				}
			}
		}
	})
}

// TestTopologyPublishersMayInvokePublish: every topic's publishers are
// admitted to publish by Cloud Run IAM (publish then checks the topic), as
// IAM members: a service account's email as serviceAccount:, a user's as
// user:; and nobody else is added.
func TestTopologyPublishersMayInvokePublish(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		want := map[string]bool{}
		for _, tp := range top.Topics {
			for _, p := range tp.Publishers {
				switch {
				case strings.HasPrefix(p, "serviceAccount:"), strings.HasPrefix(p, "user:"):
					want[p] = true
				case strings.HasSuffix(p, ".gserviceaccount.com"):
					want["serviceAccount:"+p] = true
				default:
					want["user:"+p] = true
				}
			}
		}
		got := map[string]bool{}
		for _, g := range grantsOf(t, c, ev, "google_cloud_run_v2_service_iam_member", "name") {
			if strings.HasPrefix(g.resource, "google_cloud_run_v2_service_iam_member.topology_publishers[") {
				if g.target != "relaybus-publish" || g.role != "roles/run.invoker" {
					t.Errorf("%s: %s on %s", g.resource, g.role, g.target)
				}
				got[g.member] = true
			}
		}
		if strings.Join(sortedKeys(got), ",") != strings.Join(sortedKeys(want), ",") {
			t.Errorf("publish invokers from the topology %v, want %v", sortedKeys(got), sortedKeys(want))
		}
	})
}
