package infra

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/zclconf/go-cty/cty"
)

// TestNATSTransport evaluates var.nats (nats.tf) as Terraform would: with
// it set, no Pub/Sub topic, subscription, schema, Eventarc trigger or
// Pub/Sub grant is planned; every consume service pulls (CONSUMER_MODE=pull
// on always-on instances); every function and consume service gets
// TRANSPORT=nats, NATS_URL and NATS_CREDS and may read the credentials
// secret, which each service mounts; rollup and dlqreplay pull their own
// deliveries (ROLLUP_MODE, ARCHIVE_MODE) on always-on instances with CPU
// always allocated. Without it, none of that changes the Pub/Sub
// deployment (the other tests).
func TestNATSTransport(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	path, top := repoTopology(t)
	vars := requiredVars(t)
	vars["topology_file"] = cty.StringVal(path)
	vars["always_allocated_cpu"] = cty.False
	if got := c.newEvaluator(t, vars).withStubs().local("nats_env"); got.LengthInt() != 0 {
		t.Fatalf("nats_env without var.nats: %#v, want empty", got)
	}
	vars["nats"] = cty.ObjectVal(map[string]cty.Value{
		"url": cty.StringVal("tls://nats.internal:4222"), "credentials_secret": cty.StringVal("relaybus-nats-creds"), "min_instances": cty.NumberIntVal(2),
	})
	ev := c.newEvaluator(t, vars).withStubs()

	for _, key := range []string{
		"google_pubsub_topic.topic", "google_pubsub_topic.dead_letter", "google_pubsub_subscription.dead_letter_monitor",
		"google_pubsub_subscription.consumer", "google_pubsub_subscription.consumer_pull", "google_pubsub_schema.topic",
		"google_eventarc_trigger.consumer", "google_pubsub_topic_iam_member.publish_publisher", "google_pubsub_topic_iam_member.relay_publisher",
		"google_pubsub_topic_iam_member.consume_rollup", "google_pubsub_topic_iam_member.consume_dead_letter", "google_pubsub_topic_iam_member.consume_emits",
		"google_pubsub_subscription_iam_member.pull_consume",
	} {
		if keys := forEachKeys(t, ev, c.resource(t, key)); len(keys) != 0 {
			t.Errorf("%s: %d instances on NATS (%s), want none", key, len(keys), strings.Join(sortedKeys(keys), ", "))
		}
	}
	for _, key := range []string{"google_pubsub_topic.rollup", "google_pubsub_subscription.rollup", "google_eventarc_trigger.rollup"} {
		if n, _ := ev.eval(c.resource(t, key).Body.Attributes["count"].Expr, nil); !n.RawEquals(cty.NumberIntVal(0)) {
			t.Errorf("%s: count %#v on NATS, want 0", key, n)
		}
	}

	wantEnv := map[string]string{"TRANSPORT": "nats", "NATS_URL": "tls://nats.internal:4222", "NATS_CREDS": "/secrets/nats/creds"}
	env := jsonValue(t, ev.local("consume_env")).(map[string]any)
	run := c.resource(t, "google_cloud_run_v2_service.consume")
	runs := forEachKeys(t, ev, run)
	for _, cs := range top.Consumers() {
		sub := cs.Subscription()
		e := env[sub].(map[string]any)
		for k, v := range wantEnv {
			if e[k] != v {
				t.Errorf("consume %s: %s=%v, want %s", sub, k, e[k], v)
			}
		}
		if e["CONSUMER_MODE"] != "pull" {
			t.Errorf("consume %s: CONSUMER_MODE=%v, want pull (JetStream has no push)", sub, e["CONSUMER_MODE"])
		}
		in := newInstance(t, ev, ev.stubs, "google_cloud_run_v2_service.consume", sub, runs[sub])
		tmpl := block(t, sub, run.Body, "template")
		if lo := in.attr(block(t, sub, tmpl, "scaling"), "min_instance_count"); !lo.RawEquals(cty.NumberIntVal(1)) {
			t.Errorf("consume %s: min instances %#v, want pull_mode's 1", sub, lo)
		}
	}

	fns := jsonValue(t, ev.local("functions")).(map[string]any)
	for name, want := range map[string]map[string]string{
		"publish": {}, "relay": {},
		"rollup":    {"ROLLUP_MODE": "pull"},
		"dlqreplay": {"ARCHIVE_MODE": "pull"},
	} {
		e := fns[name].(map[string]any)["env"].(map[string]any)
		for k, v := range wantEnv {
			want[k] = v
		}
		for k, v := range want {
			if e[k] != v {
				t.Errorf("%s: %s=%v, want %s", name, k, e[k], v)
			}
		}
	}
	svc := c.resource(t, "google_cloud_run_v2_service.function")
	svcs := forEachKeys(t, ev, svc)
	for name, pulls := range map[string]bool{"publish": false, "relay": false, "rollup": true, "dlqreplay": true} {
		in := newInstance(t, ev, ev.stubs, "google_cloud_run_v2_service.function", name, svcs[name])
		tmpl := block(t, name, svc.Body, "template")
		wantMin, wantIdle := int64(0), true
		if pulls {
			wantMin, wantIdle = 2, false
		}
		if lo := in.attr(block(t, name, tmpl, "scaling"), "min_instance_count"); !lo.RawEquals(cty.NumberIntVal(wantMin)) {
			t.Errorf("%s: min instances %#v, want %d", name, lo, wantMin)
		}
		res := block(t, name, block(t, name, tmpl, "containers"), "resources")
		if idle := in.attr(res, "cpu_idle"); !idle.RawEquals(cty.BoolVal(wantIdle)) {
			t.Errorf("%s: cpu_idle %#v, want %v", name, idle, wantIdle)
		}
	}

	fnGrants := forEachKeys(t, ev, c.resource(t, "google_secret_manager_secret_iam_member.nats_credentials_function"))
	if got := strings.Join(sortedKeys(fnGrants), ","); got != "dlqreplay,publish,relay,rollup" {
		t.Errorf("the credentials secret is readable by functions %s, want every one", got)
	}
	if got := len(forEachKeys(t, ev, c.resource(t, "google_secret_manager_secret_iam_member.nats_credentials_consume"))); got != len(top.Consumers()) {
		t.Errorf("the credentials secret is readable by %d consume services, want %d", got, len(top.Consumers()))
	}
	// dlqreplay runs at least min_instances on NATS: its pools are counted
	// by the larger of that and its max_instances (2 by default), on every
	// database it uses.
	roles := jsonValue(t, ev.local("database_roles")).(map[string]any)
	conns := jsonValue(t, ev.local("database_connections")).(map[string]any)
	vars["nats"] = cty.ObjectVal(map[string]cty.Value{"url": cty.StringVal("tls://nats.internal:4222"), "min_instances": cty.NumberIntVal(5)})
	more := c.newEvaluator(t, vars).withStubs()
	moreRoles := jsonValue(t, more.local("database_roles")).(map[string]any)
	moreConns := jsonValue(t, more.local("database_connections")).(map[string]any)
	for _, d := range top.Databases {
		if got := roles[d.Name+"/dlqreplay"].(map[string]any)["max_instances"]; got != json.Number("2") {
			t.Errorf("dlqreplay on %s with min_instances 2: counted as %v instances, want its max_instances 2", d.Name, got)
		}
		if got := moreRoles[d.Name+"/dlqreplay"].(map[string]any)["max_instances"]; got != json.Number("5") {
			t.Errorf("dlqreplay on %s with min_instances 5: counted as %v instances, want 5", d.Name, got)
		}
		was, _ := conns[d.Name].(json.Number).Int64()
		now, _ := moreConns[d.Name].(json.Number).Int64()
		if now != was+5*3 {
			t.Errorf("database %s: %d connections counted with min_instances 5, want %d (3 more dlqreplay instances × pool 5)", d.Name, now, was+15)
		}
	}

	if got := ev.local("nats_credentials"); !got.RawEquals(cty.TupleVal([]cty.Value{cty.StringVal("relaybus-nats-creds")})) && !got.RawEquals(cty.ListVal([]cty.Value{cty.StringVal("relaybus-nats-creds")})) {
		t.Errorf("nats_credentials %#v, want the secret, mounted by every service", got)
	}
}

// TestPrivacyKeyFromSecretManager: with var.privacy_key_secret set, every
// function reads PRIVACY_KEY from that secret, which each function's own
// account may read; without it, no function gets the variable.
func TestPrivacyKeyFromSecretManager(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	path, _ := repoTopology(t)
	vars := requiredVars(t)
	vars["topology_file"] = cty.StringVal(path)
	grant := c.resource(t, "google_secret_manager_secret_iam_member.privacy_key")
	if keys := forEachKeys(t, c.newEvaluator(t, vars).withStubs(), grant); len(keys) != 0 {
		t.Errorf("privacy key grants without the secret: %v", sortedKeys(keys))
	}
	vars["privacy_key_secret"] = cty.StringVal("relaybus-privacy-key")
	ev := c.newEvaluator(t, vars).withStubs()
	if got := strings.Join(sortedKeys(forEachKeys(t, ev, grant)), ","); got != "dlqreplay,publish,relay,rollup" {
		t.Errorf("the privacy key is readable by %s, want every function", got)
	}
	svc := c.resource(t, "google_cloud_run_v2_service.function")
	found := false
	for _, b := range block(t, "function", block(t, "function", svc.Body, "template"), "containers").Blocks {
		if b.Type != "dynamic" {
			continue
		}
		content := block(t, "function", b.Body, "content")
		if n, ok := content.Attributes["name"]; ok && strings.Contains(c.exprSource(n.Expr), "PRIVACY_KEY") {
			found = strings.Contains(c.exprSource(b.Body.Attributes["for_each"].Expr), "var.privacy_key_secret")
		}
	}
	if !found {
		t.Error("no function env block sets PRIVACY_KEY from var.privacy_key_secret")
	}
}
