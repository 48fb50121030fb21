package infra

import (
	"strings"
	"testing"

	"github.com/zclconf/go-cty/cty"

	"github.com/relaybus/relaybus/shared/topology"
)

// TestPullModeOnCloudRun evaluates var.pull_mode (pull.tf) as Terraform
// would: off by default (no pull consumer, every consume service push or
// Eventarc); enabled for one push and one Eventarc consumer, those two get
// an ordered, filtered, dead-lettered pull subscription with exactly-once
// delivery and no push endpoint, no push subscription and no trigger, a
// consume service that pulls (CONSUMER_MODE=pull, PULL_MAX_IN_FLIGHT) on
// always-on instances with CPU always allocated, subscriber grants for
// their own account, the Pub/Sub service agent and dlqreplay, and their
// subscription in dlqreplay's map; the other consumers stay as they were.
func TestPullModeOnCloudRun(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	path, top := repoTopology(t)

	vars := requiredVars(t)
	vars["topology_file"] = cty.StringVal(path)
	if got := c.newEvaluator(t, vars).local("pull_consumers"); got.LengthInt() != 0 {
		t.Fatalf("pull mode is on by default for %d consumers", got.LengthInt())
	}

	var pulled []string
	byMode := map[string]string{}
	for _, cs := range top.Consumers() {
		if byMode[cs.Delivery] == "" {
			byMode[cs.Delivery] = cs.Subscription()
			pulled = append(pulled, cs.Subscription())
		}
	}
	if byMode[topology.DeliveryPush] == "" || byMode[topology.DeliveryEventarc] == "" {
		t.Fatalf("the topology has no push or no Eventarc consumer to turn to pull: %v", byMode)
	}
	isPulled := map[string]bool{}
	list := make([]cty.Value, len(pulled))
	for i, s := range pulled {
		isPulled[s], list[i] = true, cty.StringVal(s)
	}
	vars["pull_mode"] = cty.ObjectVal(map[string]cty.Value{
		"enabled": cty.True, "consumers": cty.ListVal(list), "min_instances": cty.NumberIntVal(2),
		"max_instances": cty.NumberIntVal(3), "max_in_flight": cty.NumberIntVal(4), "exactly_once_delivery": cty.True,
	})
	vars["always_allocated_cpu"] = cty.False // so that the pull consumers' own CPU setting shows
	ev := c.newEvaluator(t, vars).withStubs()

	if got := strings.Join(sortedKeys(jsonValue(t, ev.local("pull_consumers")).(map[string]any)), ","); got != strings.Join(sorted(pulled), ",") {
		t.Fatalf("pull consumers %s, want %s", got, strings.Join(sorted(pulled), ","))
	}
	for _, key := range []string{"google_pubsub_subscription.consumer", "google_eventarc_trigger.consumer"} {
		for k := range forEachKeys(t, ev, c.resource(t, key)) {
			if isPulled[k] {
				t.Errorf("%s[%s] exists for a pull consumer", key, k)
			}
		}
	}

	b := c.resource(t, "google_pubsub_subscription.consumer_pull")
	instances := forEachKeys(t, ev, b)
	if got := strings.Join(sortedKeys(instances), ","); got != strings.Join(sorted(pulled), ",") {
		t.Fatalf("pull subscriptions %s, want %s", got, strings.Join(sorted(pulled), ","))
	}
	for key, value := range instances {
		cs, _ := top.Consumer(key)
		in := newInstance(t, ev, ev.stubs, "google_pubsub_subscription.consumer_pull", key, value)
		for name, w := range map[string]cty.Value{
			"name":                         cty.StringVal(cs.Subscription()),
			"topic":                        cty.StringVal(stubProject + "/topics/" + cs.Topic),
			"enable_message_ordering":      cty.True,
			"enable_exactly_once_delivery": cty.True,
			"filter":                       cty.StringVal(cs.Filter()),
			"ack_deadline_seconds":         cty.NumberIntVal(int64(cs.AckDeadlineSeconds)),
		} {
			if got := in.attr(b.Body, name); !got.RawEquals(w) {
				t.Errorf("%s: %s = %#v, want %#v", key, name, got, w)
			}
		}
		dl := block(t, key, b.Body, "dead_letter_policy")
		if got := in.attr(dl, "dead_letter_topic").AsString(); got != stubProject+"/topics/"+cs.DeadLetterTopic() {
			t.Errorf("%s: dead_letter_topic %s, want %s", key, got, cs.DeadLetterTopic())
		}
		if got := in.attr(dl, "max_delivery_attempts"); !got.RawEquals(cty.NumberIntVal(int64(cs.MaxDeliveryAttempts))) {
			t.Errorf("%s: max_delivery_attempts %#v, want %d", key, got, cs.MaxDeliveryAttempts)
		}
		if got := in.attr(block(t, key, b.Body, "retry_policy"), "minimum_backoff").AsString(); got != itoa(cs.MinBackoffSeconds)+"s" {
			t.Errorf("%s: minimum_backoff %s, want %ds", key, got, cs.MinBackoffSeconds)
		}
		for _, nb := range b.Body.Blocks {
			if nb.Type == "push_config" || nb.Type == "dynamic" {
				t.Errorf("%s: a pull subscription has a %s block", key, nb.Type)
			}
		}
	}

	env := jsonValue(t, ev.local("consume_env")).(map[string]any)
	run := c.resource(t, "google_cloud_run_v2_service.consume")
	runs := forEachKeys(t, ev, run)
	for _, cs := range top.Consumers() {
		sub := cs.Subscription()
		e := env[sub].(map[string]any)
		wantMode, wantMin, wantMax, wantIdle := "push", int64(0), int64(10), true
		if isPulled[sub] {
			wantMode, wantMin, wantMax, wantIdle = "pull", 2, 3, false
		}
		if e["CONSUMER_MODE"] != wantMode || e["PULL_MAX_IN_FLIGHT"] != "4" {
			t.Errorf("consume %s: CONSUMER_MODE=%v PULL_MAX_IN_FLIGHT=%v, want %s and 4", sub, e["CONSUMER_MODE"], e["PULL_MAX_IN_FLIGHT"], wantMode)
		}
		in := newInstance(t, ev, ev.stubs, "google_cloud_run_v2_service.consume", sub, runs[sub])
		tmpl := block(t, sub, run.Body, "template")
		scaling := block(t, sub, tmpl, "scaling")
		if lo, hi := in.attr(scaling, "min_instance_count"), in.attr(scaling, "max_instance_count"); !lo.RawEquals(cty.NumberIntVal(wantMin)) || !hi.RawEquals(cty.NumberIntVal(wantMax)) {
			t.Errorf("consume %s: instances %#v..%#v, want %d..%d", sub, lo, hi, wantMin, wantMax)
		}
		res := block(t, sub, block(t, sub, tmpl, "containers"), "resources")
		if got := in.attr(res, "cpu_idle"); !got.RawEquals(cty.BoolVal(wantIdle)) {
			t.Errorf("consume %s: cpu_idle %#v, want %v", sub, got, wantIdle)
		}
	}

	ids := jsonValue(t, ev.local("consumer_subscription_ids")).(map[string]any)
	grants := grantsOf(t, c, ev, "google_pubsub_subscription_iam_member", "subscription")
	for _, sub := range pulled {
		if ids[sub] != sub {
			t.Errorf("dlqreplay's subscription map: %s => %v, want itself", sub, ids[sub])
		}
		want := map[string]bool{
			consumeMember(ev, sub): true,
			"serviceAccount:service-123456789@gcp-sa-pubsub.iam.gserviceaccount.com":  true,
			"serviceAccount:relaybus-dlqreplay@relaybus-test.iam.gserviceaccount.com": true,
		}
		for _, g := range grants {
			if g.target == sub && g.role == "roles/pubsub.subscriber" {
				delete(want, g.member)
			}
		}
		if len(want) > 0 {
			t.Errorf("%s: no roles/pubsub.subscriber for %v", sub, sortedKeys(want))
		}
	}
}

// pullVars is the repository's topology with pull_mode set to mode.
func pullVars(t *testing.T, mode map[string]cty.Value) map[string]cty.Value {
	path, _ := repoTopology(t)
	vars := requiredVars(t)
	vars["topology_file"] = cty.StringVal(path)
	vars["pull_mode"] = cty.ObjectVal(mode)
	return vars
}

// pullModeErrors evaluates terraform_data.pull_mode's precondition.
func pullModeErrors(t *testing.T, c *tfConfig, vars map[string]cty.Value) []any {
	t.Helper()
	b := c.resource(t, "terraform_data.pull_mode")
	pre := block(t, "pull_mode", block(t, "pull_mode", b.Body, "lifecycle"), "precondition")
	if got := c.exprSource(pre.Attributes["condition"].Expr); got != "length(local.pull_mode_errors) == 0" {
		t.Fatalf("terraform_data.pull_mode precondition %s", got)
	}
	return jsonValue(t, c.newEvaluator(t, vars).local("pull_mode_errors")).([]any)
}

// TestPullModeIsCheckedBeforeAnythingIsCreated: pull_mode.consumers names
// consumers of the topology (a typo left a consumer on push without a
// word), and PULL_MAX_IN_FLIGHT is the pool's size by default and never
// more (16 deliveries on a pool of 5 held their leases while they waited
// for a connection). Every consume service waits on the check.
func TestPullModeIsCheckedBeforeAnythingIsCreated(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	_, top := repoTopology(t)
	sub := top.Consumers()[0].Subscription()
	on := func(extra map[string]cty.Value) map[string]cty.Value {
		m := map[string]cty.Value{"enabled": cty.True}
		for k, v := range extra {
			m[k] = v
		}
		return pullVars(t, m)
	}
	if errs := pullModeErrors(t, c, on(map[string]cty.Value{"consumers": cty.ListVal([]cty.Value{cty.StringVal(sub)})})); len(errs) != 0 {
		t.Errorf("a declared consumer is refused: %v", errs)
	}
	errs := pullModeErrors(t, c, on(map[string]cty.Value{"consumers": cty.ListVal([]cty.Value{cty.StringVal("shop.order.events.member-servce-processor")})}))
	if len(errs) != 1 || !strings.Contains(errs[0].(string), `"shop.order.events.member-servce-processor" is no consumer of the topology`) || !strings.Contains(errs[0].(string), sub) {
		t.Errorf("a misspelt consumer: %v", errs)
	}
	errs = pullModeErrors(t, c, on(map[string]cty.Value{"max_in_flight": cty.NumberIntVal(16)}))
	if len(errs) != 1 || !strings.Contains(errs[0].(string), "pull_mode.max_in_flight 16 is above cloud_sql.pool_max_conns 5") {
		t.Errorf("16 in flight on a pool of 5: %v", errs)
	}
	ev := c.newEvaluator(t, on(nil)).withStubs()
	for k, e := range jsonValue(t, ev.local("consume_env")).(map[string]any) {
		if got := e.(map[string]any)["PULL_MAX_IN_FLIGHT"]; got != "5" {
			t.Errorf("%s: PULL_MAX_IN_FLIGHT %v by default, want the pool's 5", k, got)
		}
	}
	if !contains(dependsOn(t, c.resource(t, "google_cloud_run_v2_service.consume")), "terraform_data.pull_mode") {
		t.Error("the consume services do not wait for the pull mode check")
	}
}

// TestPullWorkersStartAfterTheirGrants: a pull consumer's worker pulls as
// soon as its revision starts; it started before its subscription's grants
// existed and backed off up to ten minutes. The consume services now wait
// for a propagation wait over every pull grant.
func TestPullWorkersStartAfterTheirGrants(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	if !contains(dependsOn(t, c.resource(t, "google_cloud_run_v2_service.consume")), "time_sleep.pull_grant_propagation") {
		t.Error("the consume services do not wait for the pull grants")
	}
	src := c.exprSourceOfBlock(c.resource(t, "time_sleep.pull_grant_propagation"))
	for _, g := range c.resourcesOfType("google_pubsub_subscription_iam_member") {
		if strings.Contains(c.exprSourceOfBlock(c.resources[g]), "consumer_pull") && !strings.Contains(src, g+" ") {
			t.Errorf("time_sleep.pull_grant_propagation does not wait for %s", g)
		}
	}
	if got := c.exprSource(c.resource(t, "time_sleep.pull_grant_propagation").Body.Attributes["create_duration"].Expr); got != "var.propagation_waits.iam" {
		t.Errorf("pull grant wait %s", got)
	}
}

// TestDlqreplayKnowsThePullConsumers: dlqreplay refuses to pause, resume or
// rebuild a pull consumer with the reason (it has no push endpoint; it
// answered a permission error), so it is told which they are.
func TestDlqreplayKnowsThePullConsumers(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	_, top := repoTopology(t)
	a, b := top.Consumers()[0].Subscription(), top.Consumers()[1].Subscription()
	ev := c.newEvaluator(t, pullVars(t, map[string]cty.Value{"enabled": cty.True, "consumers": cty.ListVal([]cty.Value{cty.StringVal(b), cty.StringVal(a)})})).withStubs()
	wired := jsonValue(t, ev.local("function_wired_env")).(map[string]any)["dlqreplay"].(map[string]any)
	if got, want := wired["DLQREPLAY_PULL_CONSUMERS"], strings.Join(sorted([]string{a, b}), ","); got != want {
		t.Errorf("DLQREPLAY_PULL_CONSUMERS %v, want %s", got, want)
	}
}
