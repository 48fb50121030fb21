package infra

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/shared/topology"
)

// The stand-ins' identities of forwarders.tf and those it grants to.
const (
	forwardersMember     = "serviceAccount:relaybus-forwarders@relaybus-test.iam.gserviceaccount.com"
	forwardersPushEmail  = "relaybus-fwd-push@relaybus-test.iam.gserviceaccount.com"
	forwardersPushMember = "serviceAccount:" + forwardersPushEmail
	dlqreplayMember      = "serviceAccount:relaybus-dlqreplay@relaybus-test.iam.gserviceaccount.com"
	schedulerMember      = "serviceAccount:relaybus-scheduler@relaybus-test.iam.gserviceaccount.com"
	pubsubAgentMember    = "serviceAccount:service-123456789@gcp-sa-pubsub.iam.gserviceaccount.com"
)

// forwardersOn is var.forwarders enabled, with the given attributes
// besides (optional() defaults apply to the rest, as in Terraform).
func forwardersOn(attrs map[string]cty.Value) cty.Value {
	m := map[string]cty.Value{"enabled": cty.True}
	for k, v := range attrs {
		m[k] = v
	}
	return cty.ObjectVal(m)
}

// iamTargets is the attribute naming what each IAM member type grants on.
var iamTargets = map[string]string{
	"google_project_iam_member":               "project",
	"google_pubsub_topic_iam_member":          "topic",
	"google_pubsub_subscription_iam_member":   "subscription",
	"google_service_account_iam_member":       "service_account_id",
	"google_cloud_run_v2_service_iam_member":  "name",
	"google_secret_manager_secret_iam_member": "secret_id",
	"google_storage_bucket_iam_member":        "bucket",
}

// allGrants is every IAM grant the configuration makes, evaluated, as
// "member | role | target".
func allGrants(t *testing.T, c *tfConfig, ev *evaluator) map[string]string {
	t.Helper()
	out := map[string]string{}
	for typ, attr := range iamTargets {
		for _, g := range grantsOf(t, c, ev, typ, attr) {
			out[g.member+" | "+g.role+" | "+g.target] = g.resource
		}
	}
	return out
}

// TestForwardersAddExactlyTheirGrants: enabling var.forwarders takes no
// grant away and adds exactly these, for every topology: the forwarders
// service's account gets what a declared consumer's gets (its own
// database role's URL, Cloud SQL Client, publisher on the rollup topic and
// on every <topic>.dlq, the claim check's reader, telemetry) and nothing
// else; the push identity may only invoke the forwarders service;
// dlqreplay gets subscription create and delete on the project, attach on
// each topology topic (not the .dlq or rollup topics) and actAs on the
// push identity only; the Pub/Sub service agent subscriber on the project
// (dead-lettering on subscriptions made at run time) and token creator on
// the push identity; Scheduler invokes the service. The two custom roles
// hold exactly the permissions dlqreplay's calls need.
func TestForwardersAddExactlyTheirGrants(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		base := allGrants(t, c, ev)
		vars := requiredVars(t)
		vars["topology_file"] = ev.vars["topology_file"]
		vars["forwarders"] = forwardersOn(nil)
		on := allGrants(t, c, c.newEvaluator(t, vars).withStubs())

		want := map[string]bool{}
		add := func(member, role, target string) { want[member+" | "+role+" | "+target] = true }
		add(forwardersMember, "roles/secretmanager.secretAccessor", "relaybus-database-url-main-forwarders")
		add(forwardersMember, "roles/cloudsql.client", "relaybus-test")
		add(forwardersMember, "roles/pubsub.publisher", top.Rollup.Topic)
		add(forwardersMember, "roles/storage.objectViewer", stubClaimCheckBucket)
		for _, r := range []string{"roles/cloudtrace.agent", "roles/monitoring.metricWriter", "roles/serviceusage.serviceUsageConsumer"} {
			add(forwardersMember, r, "relaybus-test")
		}
		pushAccount := stubProject + "/serviceAccounts/" + forwardersPushEmail
		add(forwardersPushMember, "roles/run.invoker", "relaybus-forwarders")
		add(schedulerMember, "roles/run.invoker", "relaybus-forwarders")
		add(dlqreplayMember, stubProject+"/roles/relaybusForwarderSubscriptions", "relaybus-test")
		add(dlqreplayMember, "roles/iam.serviceAccountUser", pushAccount)
		// Pausing a forwarder (its breaker, an operator): its push endpoint.
		add(forwardersMember, stubProject+"/roles/relaybusPushControl", "relaybus-test")
		add(dlqreplayMember, stubProject+"/roles/relaybusPushControl", "relaybus-test")
		add(forwardersMember, "roles/iam.serviceAccountUser", pushAccount)
		add(pubsubAgentMember, "roles/iam.serviceAccountTokenCreator", pushAccount)
		add(pubsubAgentMember, "roles/pubsub.subscriber", "relaybus-test")
		for _, tp := range top.Topics {
			add(forwardersMember, "roles/pubsub.publisher", tp.Name+".dlq")
			add(dlqreplayMember, stubProject+"/roles/relaybusAttachSubscription", tp.Name)
		}

		addsExactly(t, "", base, on, want)
	})

	c := loadTerraform(t, terraformDir(t))
	for key, want := range map[string][]string{
		"google_project_iam_custom_role.forwarder_subscriptions": {"pubsub.subscriptions.create", "pubsub.subscriptions.delete"},
		"google_project_iam_custom_role.attach_subscription":     {"pubsub.topics.attachSubscription"},
	} {
		v, diags := c.resource(t, key).Body.Attributes["permissions"].Expr.Value(nil)
		if diags.HasErrors() {
			t.Fatalf("%s: %s", key, diags.Error())
		}
		var got []string
		for it := v.ElementIterator(); it.Next(); {
			_, p := it.Element()
			got = append(got, p.AsString())
		}
		sort.Strings(got)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: permissions %v, want exactly %v", key, got, want)
		}
	}
	// Without a claim check or telemetry, the forwarders service gets
	// neither grant.
	vars := requiredVars(t)
	vars["forwarders"] = forwardersOn(nil)
	vars["claim_check"] = cty.ObjectVal(map[string]cty.Value{"enabled": cty.False})
	vars["telemetry"] = cty.ObjectVal(map[string]cty.Value{"export": cty.StringVal("off")})
	for g := range allGrants(t, c, c.newEvaluator(t, vars).withStubs()) {
		if strings.HasPrefix(g, forwardersMember) && (strings.Contains(g, "storage.") || strings.Contains(g, "cloudtrace") || strings.Contains(g, "monitoring") || strings.Contains(g, "serviceusage")) {
			t.Errorf("claim check and telemetry off: still %s", g)
		}
	}
}

// forwardersResources are the resources forwarders.tf declares, but its
// precondition.
func forwardersResources(t *testing.T, c *tfConfig) []*hclsyntax.Block {
	t.Helper()
	var out []*hclsyntax.Block
	for _, b := range c.files["forwarders.tf"].Blocks {
		if b.Type == "resource" && b.Labels[0]+"."+b.Labels[1] != "terraform_data.forwarders" {
			out = append(out, b)
		}
	}
	if len(out) < 10 {
		t.Fatalf("forwarders.tf declares %d resources", len(out))
	}
	return out
}

// instances is how many instances a resource of count or for_each has.
func instances(t *testing.T, ev *evaluator, b *hclsyntax.Block) int {
	t.Helper()
	if _, ok := b.Body.Attributes["for_each"]; ok {
		return len(forEachKeys(t, ev, b))
	}
	if _, ok := b.Body.Attributes["count"]; !ok {
		t.Fatalf("%s.%s has neither count nor for_each: it would exist with the forwarders off", b.Labels[0], b.Labels[1])
	}
	return countOf(t, ev, b)
}

// TestForwardersAreOffByDefault: by default, on Pub/Sub and on NATS, no
// resource of forwarders.tf exists, dlqreplay is given no forwarders
// setting (so POST /forwarders answers 501, functions/dlqreplay's
// TestAddingAForwarderWhereNoneCanBeServedAnswers501) and no database role
// is made for it; asked for on a database the topology lacks, on either
// transport, the plan is refused with the reason.
func TestForwardersAreOffByDefault(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	path, _ := repoTopology(t)
	pre := block(t, "terraform_data.forwarders", block(t, "terraform_data.forwarders", c.resource(t, "terraform_data.forwarders").Body, "lifecycle"), "precondition")
	unknown := forwardersOn(map[string]cty.Value{"database": cty.StringVal("orders")})
	const refusal = `forwarders.database "orders" is not one of the topology's databases (main, member)`
	for _, tc := range []struct {
		name   string
		vars   map[string]cty.Value
		refuse string
	}{
		{"by default", nil, ""},
		{"on NATS", map[string]cty.Value{"nats": natsOn("relaybus-nats-creds")}, ""},
		{"on an unknown database", map[string]cty.Value{"forwarders": unknown}, refusal},
		{"on NATS on an unknown database", map[string]cty.Value{"forwarders": unknown, "nats": natsOn("")}, refusal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vars := requiredVars(t)
			vars["topology_file"] = cty.StringVal(path)
			for k, v := range tc.vars {
				vars[k] = v
			}
			ev := c.newEvaluator(t, vars).withStubs()
			ok, diags := ev.eval(pre.Attributes["condition"].Expr, nil)
			if diags.HasErrors() {
				t.Fatal(diags.Error())
			}
			msg, _ := ev.eval(pre.Attributes["error_message"].Expr, nil)
			if refused := ok.False(); refused != (tc.refuse != "") || (refused && !strings.Contains(msg.AsString(), tc.refuse)) {
				t.Errorf("precondition holds %v (%q), want refused %v naming %q", ok.True(), msg.AsString(), tc.refuse != "", tc.refuse)
			}
			if tc.refuse != "" {
				return // refused before anything is planned
			}
			for _, b := range forwardersResources(t, c) {
				if n := instances(t, ev, b); n != 0 {
					t.Errorf("%s.%s: %d instances, want none", b.Labels[0], b.Labels[1], n)
				}
			}
			wired := jsonValue(t, ev.local("function_wired_env")).(map[string]any)["dlqreplay"].(map[string]any)
			for name := range forwardersEnv {
				if v, set := wired[name]; set {
					t.Errorf("dlqreplay: %s=%v, but no forwarders service is deployed", name, v)
				}
			}
			for k := range jsonValue(t, ev.local("database_roles")).(map[string]any) {
				if strings.HasSuffix(k, "/forwarders") {
					t.Errorf("database role %s, but no forwarders service is deployed", k)
				}
			}
		})
	}
}

// addsExactly checks that enabling the forwarders (where: "" or " on
// NATS") keeps every grant of base, and that what on adds is exactly want.
func addsExactly(t *testing.T, where string, base, on map[string]string, want map[string]bool) {
	t.Helper()
	for g, res := range base {
		if _, kept := on[g]; !kept {
			t.Errorf("enabling the forwarders%s takes away %s (%s)", where, g, res)
		}
	}
	for g, res := range on {
		if _, before := base[g]; !before && !want[g] {
			t.Errorf("enabling the forwarders%s grants %s (%s), which is not theirs", where, g, res)
		}
	}
	for g := range want {
		if _, ok := on[g]; !ok {
			t.Errorf("enabling the forwarders%s does not grant %s", where, g)
		} else if _, before := base[g]; before {
			t.Errorf("%s is granted with the forwarders off", g)
		}
	}
}

// natsOn is var.nats on a TLS server, with the credentials secret named
// (none when empty).
func natsOn(credentials string) cty.Value {
	return cty.ObjectVal(map[string]cty.Value{"url": cty.StringVal("tls://nats.internal:4222"), "credentials_secret": cty.StringVal(credentials)})
}

// forwardersPubSubOnly are the resources of forwarders.tf that exist on
// Pub/Sub only: the pushes' identity and its grants, the Pub/Sub grants
// of the service, dlqreplay and the Pub/Sub agent, and the breaker-probe
// job (on NATS the service answers /breaker:probe 404: no push endpoint
// to detach).
var forwardersPubSubOnly = map[string]bool{
	"google_service_account.forwarders_push":                                true,
	"google_pubsub_topic_iam_member.forwarders_rollup":                      true,
	"google_pubsub_topic_iam_member.forwarders_dead_letter":                 true,
	"google_cloud_run_v2_service_iam_member.forwarders_push_invoker":        true,
	"google_service_account_iam_member.agent_token_creator_forwarders_push": true,
	"google_project_iam_member.agent_forwarders_dead_letter":                true,
	"google_project_iam_custom_role.forwarder_subscriptions":                true,
	"google_project_iam_custom_role.attach_subscription":                    true,
	"google_project_iam_member.dlqreplay_forwarder_subscriptions":           true,
	"google_pubsub_topic_iam_member.dlqreplay_attach_subscription":          true,
	"google_service_account_iam_member.dlqreplay_act_as_forwarders_push":    true,
	"google_project_iam_member.forwarders_push_control":                     true,
	"google_project_iam_member.dlqreplay_forwarders_push_control":           true,
	"google_service_account_iam_member.forwarders_act_as_push":              true,
	"google_cloud_scheduler_job.forwarders_breaker_probe":                   true,
}

// TestForwardersOnNATSAddExactlyTheirGrants: on NATS, enabling
// var.forwarders takes no grant away and adds exactly these, for every
// topology: the forwarders service's account gets its own database role's
// URL, Cloud SQL Client, the claim check's reader, telemetry and the NATS
// credentials secret; Scheduler invokes the service. Nothing Pub/Sub: no
// push identity, no topic or subscription grant, no custom role for
// dlqreplay (it creates and deletes the durable consumers with its NATS
// credentials), nothing for the Pub/Sub agent; every Pub/Sub-only resource
// of forwarders.tf has no instance, every other one has one.
func TestForwardersOnNATSAddExactlyTheirGrants(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		vars := requiredVars(t)
		vars["topology_file"] = ev.vars["topology_file"]
		vars["nats"] = natsOn("relaybus-nats-creds")
		base := allGrants(t, c, c.newEvaluator(t, vars).withStubs())
		vars["forwarders"] = forwardersOn(nil)
		onEv := c.newEvaluator(t, vars).withStubs()
		on := allGrants(t, c, onEv)

		want := map[string]bool{}
		add := func(member, role, target string) { want[member+" | "+role+" | "+target] = true }
		add(forwardersMember, "roles/secretmanager.secretAccessor", "relaybus-database-url-main-forwarders")
		add(forwardersMember, "roles/secretmanager.secretAccessor", "relaybus-nats-creds")
		add(forwardersMember, "roles/cloudsql.client", "relaybus-test")
		add(forwardersMember, "roles/storage.objectViewer", stubClaimCheckBucket)
		for _, r := range []string{"roles/cloudtrace.agent", "roles/monitoring.metricWriter", "roles/serviceusage.serviceUsageConsumer"} {
			add(forwardersMember, r, "relaybus-test")
		}
		add(schedulerMember, "roles/run.invoker", "relaybus-forwarders")

		addsExactly(t, " on NATS", base, on, want)
		for _, b := range forwardersResources(t, c) {
			key := b.Labels[0] + "." + b.Labels[1]
			n := instances(t, onEv, b)
			switch {
			case forwardersPubSubOnly[key] && n != 0:
				t.Errorf("%s: %d instances on NATS, want none (Pub/Sub only)", key, n)
			case !forwardersPubSubOnly[key] && key != "google_secret_manager_secret_iam_member.forwarders_key" &&
				key != "google_secret_manager_secret_iam_member.dlqreplay_forwarders_key" && n != 1:
				t.Errorf("%s: %d instances on NATS, want 1", key, n)
			}
		}
	})

	// Without a credentials secret, no grant of one.
	c := loadTerraform(t, terraformDir(t))
	vars := requiredVars(t)
	vars["nats"] = natsOn("")
	vars["forwarders"] = forwardersOn(nil)
	for g, res := range allGrants(t, c, c.newEvaluator(t, vars).withStubs()) {
		if strings.HasPrefix(g, forwardersMember+" | roles/secretmanager.secretAccessor") && !strings.Contains(g, "database-url") {
			t.Errorf("NATS without credentials_secret: still %s (%s)", g, res)
		}
	}
}

// TestForwardersServiceAndDlqreplayWiring evaluates the deployment with
// forwarders enabled on each database of the repository's topology: one
// consume service relaybus-forwarders (the consume image,
// CONSUMER_HANDLER=forwarders, internal ingress, its own account, its
// DATABASE_URL from its own role's secret, its instances and concurrency,
// the forwarders' ack deadline as its timeout, CPU as consume's), whose
// environment is consume's Config less what each forwarder takes from its
// registry row; dlqreplay told its URL, the push identity and the
// database; a consume role on that database for the migrate job, counted
// in the connection check; the push identity the service's invoker; the
// Scheduler's /ledger:ship and /inbox:purge on it; and it starts after its
// grants and the migrate job.
func TestForwardersServiceAndDlqreplayWiring(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	path, top := repoTopology(t)
	svc := c.resource(t, "google_cloud_run_v2_service.forwarders")
	src := squeeze(c.exprSourceOfBlock(svc))
	for _, w := range []string{
		`ingress = "INGRESS_TRAFFIC_INTERNAL_ONLY"`, `image = local.images["consume"]`, `for_each = local.forwarders_env`,
		`name = "DATABASE_URL" value_source { secret_key_ref { secret = try(local.role_secret_ids["${var.forwarders.database}/forwarders"], "") version = "latest" } }`,
		`cpu_idle = !var.always_allocated_cpu`, `service_account = google_service_account.forwarders[0].email`,
	} {
		if !strings.Contains(src, w) {
			t.Errorf("google_cloud_run_v2_service.forwarders: no %s", w)
		}
	}
	for _, d := range []string{"terraform_data.forwarders", "terraform_data.migrate", "time_sleep.iam_propagation", "terraform_data.database_connections"} {
		if !contains(dependsOn(t, svc), d) {
			t.Errorf("google_cloud_run_v2_service.forwarders does not wait for %s", d)
		}
	}

	// What consume reads that each forwarder takes from its registry row
	// (functions/consume/forwarders.go builds one engine per row), or that
	// a push-only service without a handler of its own does not use.
	perForwarder := map[string]bool{"CONSUMER_SUBSCRIPTION": true, "FORWARD_URL": true, "FORWARD_AUTH": true, "FORWARD_AUDIENCE": true,
		"FORWARD_PROBE": true, "CONSUMER_MAX_IN_FLIGHT": true, "CONSUMER_MAX_PER_SECOND": true, "STRICT_GAP_TIMEOUT": true, "PULL_MAX_IN_FLIGHT": true}

	for _, db := range []string{"main", "member"} {
		t.Run(db, func(t *testing.T) {
			vars := requiredVars(t)
			vars["topology_file"] = cty.StringVal(path)
			vars["forwarders"] = forwardersOn(map[string]cty.Value{"database": cty.StringVal(db), "max_instances": cty.NumberIntVal(3), "concurrency": cty.NumberIntVal(20)})
			ev := c.newEvaluator(t, vars).withStubs()
			stubs := resourceStubs(t, ev)
			in := newInstance(t, ev, stubs, "google_cloud_run_v2_service.forwarders", "0", cty.Zero)
			in.extra["count"] = cty.ObjectVal(map[string]cty.Value{"index": cty.Zero})
			tmpl := block(t, "forwarders", svc.Body, "template")
			for attr, want := range map[string]cty.Value{
				"name": cty.StringVal("relaybus-forwarders"), "ingress": cty.StringVal("INGRESS_TRAFFIC_INTERNAL_ONLY"),
			} {
				if got := in.attr(svc.Body, attr); !got.RawEquals(want) {
					t.Errorf("%s = %#v, want %#v", attr, got, want)
				}
			}
			for attr, want := range map[string]cty.Value{
				"service_account":                  cty.StringVal("relaybus-forwarders@relaybus-test.iam.gserviceaccount.com"),
				"max_instance_request_concurrency": cty.NumberIntVal(20),
				"timeout":                          cty.StringVal(itoa(top.Defaults.AckDeadlineSeconds) + "s"),
			} {
				if got := in.attr(tmpl, attr); !got.RawEquals(want) {
					t.Errorf("template.%s = %#v, want %#v", attr, got, want)
				}
			}
			if got := in.attr(block(t, "forwarders", tmpl, "scaling"), "max_instance_count"); !got.RawEquals(cty.NumberIntVal(3)) {
				t.Errorf("max instances %#v, want forwarders.max_instances 3", got)
			}
			if got := in.attr(block(t, "forwarders", tmpl, "scaling"), "min_instance_count"); !got.RawEquals(cty.Zero) {
				t.Errorf("min instances %#v, want 0 (pushes start it)", got)
			}
			containers := block(t, "forwarders", tmpl, "containers")
			if idle := in.attr(block(t, "forwarders", containers, "resources"), "cpu_idle"); !idle.RawEquals(cty.False) {
				t.Errorf("cpu_idle %#v with always_allocated_cpu (the default), want false", idle)
			}
			if v := dynamicContents(t, in, tmpl, "volumes"); len(v) != 1 || v[0]["name"].AsString() != "cloudsql" {
				t.Errorf("volumes %v, want the Cloud SQL one only", v)
			}

			env := jsonValue(t, ev.local("forwarders_env")).(map[string]any)
			for name := range env {
				if !envNames["consume"][name] || strings.HasPrefix(name, "DATABASE_URL") {
					t.Errorf("forwarders: sets %s, which consume does not read as a plain value", name)
				}
			}
			for name := range envNames["consume"] {
				if _, set := env[name]; !set && name != "DATABASE_URL" && !perForwarder[name] {
					t.Errorf("forwarders: consume reads %s, which Terraform does not set", name)
				}
				if _, set := env[name]; set && perForwarder[name] {
					t.Errorf("forwarders: sets %s, which each forwarder takes from its registry row", name)
				}
			}
			for k, w := range map[string]any{
				"CONSUMER_HANDLER": consume.HandlerForwarders, "CONSUMER_ID": "forwarders", "CONSUMER_MODE": "push",
				"CONSUMER_MAX_DELIVERY_ATTEMPTS": itoa(top.Defaults.MaxDeliveryAttempts), "ROLLUP_TOPIC": top.Rollup.Topic,
				"FORWARD_TIMEOUT": "10s", "FORWARD_BREAKER_THRESHOLD": "5", "FORWARD_BREAKER_COOLDOWN": "5s", "FORWARD_BREAKER_MAX_COOLDOWN": "300s",
				"INBOX_RETENTION": "192h", "CONSUMER_FLOW_WAIT": "5s", "CLAIM_CHECK_BUCKET": stubClaimCheckBucket,
			} {
				if env[k] != w {
					t.Errorf("forwarders: %s=%v, want %v", k, env[k], w)
				}
			}

			// dlqreplay points each forwarder's subscription at the service
			// and pushes as the identity that alone may invoke it.
			wired := jsonValue(t, ev.local("function_wired_env")).(map[string]any)["dlqreplay"].(map[string]any)
			url := "https://relaybus-forwarders-" + stubProjectNumber + ".europe-west1.run.app"
			for k, w := range map[string]string{"DLQREPLAY_FORWARDERS_URL": url, "DLQREPLAY_FORWARDERS_PUSH_ACCOUNT": forwardersPushEmail, "DLQREPLAY_FORWARDERS_DATABASE": db} {
				if wired[k] != w {
					t.Errorf("dlqreplay: %s=%v, want %s", k, wired[k], w)
				}
			}
			if !strings.HasPrefix(url, "https://"+in.attr(svc.Body, "name").AsString()+"-") {
				t.Errorf("DLQREPLAY_FORWARDERS_URL %s is not the service's deterministic URL", url)
			}
			invokers := map[string]bool{}
			for _, g := range grantsOf(t, c, ev, "google_cloud_run_v2_service_iam_member", "name") {
				if g.target == "relaybus-forwarders" {
					invokers[g.member] = true
				}
			}
			if !reflect.DeepEqual(invokers, map[string]bool{forwardersPushMember: true, schedulerMember: true}) {
				t.Errorf("invokers of the forwarders service %v, want its push identity and Scheduler only", invokers)
			}

			// Its database role, for the migrate job, and its pools.
			roles := jsonValue(t, ev.local("database_roles")).(map[string]any)
			r, ok := roles[db+"/forwarders"].(map[string]any)
			if !ok || r["kind"] != "consume" || r["consumer"] != consume.ForwardersConsumer || r["max_instances"] != json.Number("3") {
				t.Errorf("database role %s/forwarders: %v, want a consume role of consumer %q, 3 instances", db, r, consume.ForwardersConsumer)
			}
			for k := range roles {
				if strings.HasSuffix(k, "/forwarders") && k != db+"/forwarders" {
					t.Errorf("database role %s: the forwarders use %s only", k, db)
				}
			}
			var spec map[string]any
			for _, s := range jsonValue(t, ev.local("database_role_specs")).(map[string]any)[db].([]any) {
				if s.(map[string]any)["consumer"] == consume.ForwardersConsumer {
					spec = s.(map[string]any)
				}
			}
			if spec == nil || spec["name"] != "relaybus_"+db+"_forwarders" || spec["connectionLimit"] != json.Number("30") {
				t.Errorf("the migrate job's forwarders role on %s: %v, want relaybus_%s_forwarders capped at 2 × pool 5 × 3", db, spec, db)
			}
			offVars := requiredVars(t)
			offVars["topology_file"] = cty.StringVal(path)
			off := jsonValue(t, c.newEvaluator(t, offVars).local("database_connections")).(map[string]any)
			conns := jsonValue(t, ev.local("database_connections")).(map[string]any)
			for d := range conns {
				was, _ := off[d].(json.Number).Int64()
				now, _ := conns[d].(json.Number).Int64()
				if want := was + map[bool]int64{true: 15, false: 0}[d == db]; now != want {
					t.Errorf("database %s: %d connections counted, want %d (pool 5 × 3 forwarders instances on %s)", d, now, want, db)
				}
			}

			// Scheduler: its /ledger:ship and /inbox:purge, after the
			// invokers' propagation.
			for key, route := range map[string]string{"google_cloud_scheduler_job.forwarders_ledger_ship": "/ledger:ship", "google_cloud_scheduler_job.forwarders_inbox_purge": "/inbox:purge",
				"google_cloud_scheduler_job.forwarders_breaker_probe": "/breaker:probe"} {
				b := c.resource(t, key)
				if n := countOf(t, ev, b); n != 1 {
					t.Fatalf("%s: %d instances", key, n)
				}
				jin := newInstance(t, ev, stubs, key, "0", cty.Zero)
				jin.extra["count"] = cty.ObjectVal(map[string]cty.Value{"index": cty.Zero})
				target := block(t, key, b.Body, "http_target")
				oidc := block(t, key, target, "oidc_token")
				uri := "https://relaybus-forwarders-test.a.run.app"
				if got := jin.attr(target, "uri").AsString(); got != uri+route || jin.attr(target, "http_method").AsString() != "POST" {
					t.Errorf("%s: %s, want POST %s", key, got, uri+route)
				}
				if jin.attr(oidc, "service_account_email").AsString() != "relaybus-scheduler@relaybus-test.iam.gserviceaccount.com" || jin.attr(oidc, "audience").AsString() != uri {
					t.Errorf("%s: OIDC %s for %s", key, jin.attr(oidc, "service_account_email").AsString(), jin.attr(oidc, "audience").AsString())
				}
				if d := jin.attr(b.Body, "attempt_deadline").AsString(); d != itoa(top.Defaults.AckDeadlineSeconds+30)+"s" {
					t.Errorf("%s: attempt deadline %s, want the service's timeout + 30s", key, d)
				}
			}
		})
	}
}

// dynamicContents evaluates body's dynamic blocks of type typ in in: for
// each element of a block's for_each, its content's attributes, those of
// nested blocks named <block>.<attribute>.
func dynamicContents(t *testing.T, in *instanceEval, body *hclsyntax.Body, typ string) []map[string]cty.Value {
	t.Helper()
	var out []map[string]cty.Value
	for _, b := range body.Blocks {
		if b.Type != "dynamic" || b.Labels[0] != typ {
			continue
		}
		content := block(t, typ, b.Body, "content")
		for it := in.attr(b.Body, "for_each").ElementIterator(); it.Next(); {
			k, v := it.Element()
			sub := &instanceEval{t: t, ev: in.ev, extra: map[string]cty.Value{}, what: in.what + "." + typ}
			for n, x := range in.extra {
				sub.extra[n] = x
			}
			sub.extra[typ] = cty.ObjectVal(map[string]cty.Value{"key": k, "value": v})
			m := map[string]cty.Value{}
			var walk func(prefix string, body *hclsyntax.Body)
			walk = func(prefix string, body *hclsyntax.Body) {
				for n := range body.Attributes {
					m[prefix+n] = sub.attr(body, n)
				}
				for _, nb := range body.Blocks {
					walk(prefix+nb.Type+".", nb.Body)
				}
			}
			walk("", content)
			out = append(out, m)
		}
	}
	return out
}

// TestForwardersOnNATSServiceAndDlqreplayWiring evaluates the deployment
// with forwarders enabled on NATS, on each database of the repository's
// topology: relaybus-forwarders pulls (CONSUMER_MODE=pull, which consume
// requires with CONSUMER_HANDLER=forwarders on TRANSPORT=nats), with
// TRANSPORT, NATS_URL and NATS_CREDS, the credentials secret mounted at
// /secrets/nats, PULL_MAX_IN_FLIGHT as a pull consumer's (within the
// pool); on exactly one instance whatever forwarders.max_instances says,
// always on and with CPU always allocated even with
// always_allocated_cpu = false; counted once in the connection check and
// its role's connection limit; invoked by Scheduler alone, for
// /ledger:ship and /inbox:purge (no /breaker:probe job: the service
// answers it 404 on NATS); dlqreplay told its URL and database but no push
// identity.
func TestForwardersOnNATSServiceAndDlqreplayWiring(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	path, top := repoTopology(t)
	svc := c.resource(t, "google_cloud_run_v2_service.forwarders")
	if !contains(dependsOn(t, svc), "terraform_data.pull_mode") {
		t.Error("google_cloud_run_v2_service.forwarders does not wait for terraform_data.pull_mode (PULL_MAX_IN_FLIGHT within the pool)")
	}
	for db, maxInFlight := range map[string]cty.Value{"main": cty.NullVal(cty.Number), "member": cty.NumberIntVal(3)} {
		t.Run(db, func(t *testing.T) {
			vars := requiredVars(t)
			vars["topology_file"] = cty.StringVal(path)
			vars["nats"] = natsOn("relaybus-nats-creds")
			vars["always_allocated_cpu"] = cty.False
			vars["pull_mode"] = cty.ObjectVal(map[string]cty.Value{"max_in_flight": maxInFlight})
			vars["forwarders"] = forwardersOn(map[string]cty.Value{"database": cty.StringVal(db), "max_instances": cty.NumberIntVal(3), "concurrency": cty.NumberIntVal(20)})
			ev := c.newEvaluator(t, vars).withStubs()
			stubs := resourceStubs(t, ev)
			in := newInstance(t, ev, stubs, "google_cloud_run_v2_service.forwarders", "0", cty.Zero)
			in.extra["count"] = cty.ObjectVal(map[string]cty.Value{"index": cty.Zero})
			if n := countOf(t, ev, svc); n != 1 {
				t.Fatalf("google_cloud_run_v2_service.forwarders: %d instances on NATS, want 1", n)
			}
			tmpl := block(t, "forwarders", svc.Body, "template")
			scaling := block(t, "forwarders", tmpl, "scaling")
			for attr := range map[string]bool{"min_instance_count": true, "max_instance_count": true} {
				if got := in.attr(scaling, attr); !got.RawEquals(cty.NumberIntVal(1)) {
					t.Errorf("%s %#v, want 1 (one instance pulls every forwarder; two would each pull them all)", attr, got)
				}
			}
			containers := block(t, "forwarders", tmpl, "containers")
			if idle := in.attr(block(t, "forwarders", containers, "resources"), "cpu_idle"); !idle.RawEquals(cty.False) {
				t.Errorf("cpu_idle %#v with always_allocated_cpu = false, want false (its pull workers run between requests)", idle)
			}
			if got := in.attr(tmpl, "max_instance_request_concurrency"); !got.RawEquals(cty.NumberIntVal(20)) {
				t.Errorf("concurrency %#v, want forwarders.concurrency 20", got)
			}

			// The credentials secret, mounted as every service mounts it.
			var nats []map[string]cty.Value
			for _, v := range dynamicContents(t, in, tmpl, "volumes") {
				if v["name"].AsString() == "nats" {
					nats = append(nats, v)
				}
			}
			if len(nats) != 1 || nats[0]["secret.secret"].AsString() != "relaybus-nats-creds" || nats[0]["secret.items.path"].AsString() != "creds" {
				t.Errorf("volumes named nats: %v, want one of secret relaybus-nats-creds as the file creds", nats)
			}
			mounts := map[string]string{}
			for _, m := range dynamicContents(t, in, containers, "volume_mounts") {
				mounts[m["name"].AsString()] = m["mount_path"].AsString()
			}
			if mounts["nats"] != "/secrets/nats" {
				t.Errorf("volume mounts %v, want nats at /secrets/nats", mounts)
			}

			env := jsonValue(t, ev.local("forwarders_env")).(map[string]any)
			wantInFlight := "5" // cloud_sql.pool_max_conns, the default
			if !maxInFlight.IsNull() {
				wantInFlight = "3"
			}
			for k, w := range map[string]any{
				"CONSUMER_HANDLER": consume.HandlerForwarders, "CONSUMER_ID": "forwarders", "CONSUMER_MODE": consume.ModePull,
				"PULL_MAX_IN_FLIGHT": wantInFlight, "TRANSPORT": "nats", "NATS_URL": "tls://nats.internal:4222", "NATS_CREDS": "/secrets/nats/creds",
				"CONSUMER_MAX_DELIVERY_ATTEMPTS": itoa(top.Defaults.MaxDeliveryAttempts), "ROLLUP_TOPIC": top.Rollup.Topic,
			} {
				if env[k] != w {
					t.Errorf("forwarders: %s=%v, want %v", k, env[k], w)
				}
			}
			for name := range env {
				// The transport's (checked above) are consume's Config too,
				// left out of envNames since Pub/Sub leaves them unset.
				transport := name == "TRANSPORT" || name == "NATS_URL" || name == "NATS_CREDS"
				if (!envNames["consume"][name] && !transport) || strings.HasPrefix(name, "DATABASE_URL") {
					t.Errorf("forwarders: sets %s, which consume does not read as a plain value", name)
				}
			}

			// dlqreplay: the URL (the sign the service is deployed) and the
			// registry's database; no push identity, there is none.
			wired := jsonValue(t, ev.local("function_wired_env")).(map[string]any)["dlqreplay"].(map[string]any)
			url := "https://relaybus-forwarders-" + stubProjectNumber + ".europe-west1.run.app"
			for k, w := range map[string]string{"DLQREPLAY_FORWARDERS_URL": url, "DLQREPLAY_FORWARDERS_DATABASE": db} {
				if wired[k] != w {
					t.Errorf("dlqreplay: %s=%v, want %s", k, wired[k], w)
				}
			}
			if v, set := wired["DLQREPLAY_FORWARDERS_PUSH_ACCOUNT"]; set {
				t.Errorf("dlqreplay: DLQREPLAY_FORWARDERS_PUSH_ACCOUNT=%v on NATS, where nothing pushes", v)
			}
			invokers := map[string]bool{}
			for _, g := range grantsOf(t, c, ev, "google_cloud_run_v2_service_iam_member", "name") {
				if g.target == "relaybus-forwarders" {
					invokers[g.member] = true
				}
			}
			if !reflect.DeepEqual(invokers, map[string]bool{schedulerMember: true}) {
				t.Errorf("invokers of the forwarders service %v, want Scheduler only", invokers)
			}

			// One instance's pools: its role's limit and the connection check.
			r, ok := jsonValue(t, ev.local("database_roles")).(map[string]any)[db+"/forwarders"].(map[string]any)
			if !ok || r["kind"] != "consume" || r["max_instances"] != json.Number("1") {
				t.Errorf("database role %s/forwarders: %v, want a consume role of 1 instance", db, r)
			}
			var spec map[string]any
			for _, s := range jsonValue(t, ev.local("database_role_specs")).(map[string]any)[db].([]any) {
				if s.(map[string]any)["consumer"] == consume.ForwardersConsumer {
					spec = s.(map[string]any)
				}
			}
			if spec == nil || spec["connectionLimit"] != json.Number("10") {
				t.Errorf("the migrate job's forwarders role on %s: %v, want capped at 2 × pool 5 × 1", db, spec)
			}
			offVars := requiredVars(t)
			offVars["topology_file"] = cty.StringVal(path)
			offVars["nats"] = natsOn("relaybus-nats-creds")
			off := jsonValue(t, c.newEvaluator(t, offVars).local("database_connections")).(map[string]any)
			conns := jsonValue(t, ev.local("database_connections")).(map[string]any)
			for d := range conns {
				was, _ := off[d].(json.Number).Int64()
				now, _ := conns[d].(json.Number).Int64()
				if want := was + map[bool]int64{true: 5, false: 0}[d == db]; now != want {
					t.Errorf("database %s: %d connections counted, want %d (pool 5 × the one forwarders instance on %s)", d, now, want, db)
				}
			}

			// Scheduler: /ledger:ship and /inbox:purge, no /breaker:probe.
			for key, route := range map[string]string{"google_cloud_scheduler_job.forwarders_ledger_ship": "/ledger:ship", "google_cloud_scheduler_job.forwarders_inbox_purge": "/inbox:purge"} {
				b := c.resource(t, key)
				if n := countOf(t, ev, b); n != 1 {
					t.Fatalf("%s: %d instances on NATS, want 1", key, n)
				}
				jin := newInstance(t, ev, stubs, key, "0", cty.Zero)
				jin.extra["count"] = cty.ObjectVal(map[string]cty.Value{"index": cty.Zero})
				if got := jin.attr(block(t, key, b.Body, "http_target"), "uri").AsString(); got != "https://relaybus-forwarders-test.a.run.app"+route {
					t.Errorf("%s: %s, want the service's %s", key, got, route)
				}
			}
			if n := countOf(t, ev, c.resource(t, "google_cloud_scheduler_job.forwarders_breaker_probe")); n != 0 {
				t.Errorf("forwarders_breaker_probe: %d jobs on NATS, where the service answers /breaker:probe 404", n)
			}
		})
	}
}

// TestForwardersKeyFromSecretManager: with forwarders.key_secret,
// dlqreplay and the forwarders service read RELAYBUS_FORWARDERS_KEY (the
// key hmac forwarders' signing secrets are sealed under) from that secret,
// which their two accounts alone may read; without it, no grant.
func TestForwardersKeyFromSecretManager(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	path, _ := repoTopology(t)
	vars := requiredVars(t)
	vars["topology_file"] = cty.StringVal(path)
	vars["forwarders"] = forwardersOn(nil)
	grants := []*hclsyntax.Block{c.resource(t, "google_secret_manager_secret_iam_member.forwarders_key"), c.resource(t, "google_secret_manager_secret_iam_member.dlqreplay_forwarders_key")}
	for _, g := range grants {
		if n := countOf(t, c.newEvaluator(t, vars).withStubs(), g); n != 0 {
			t.Errorf("%s.%s: %d grants without the secret", g.Labels[0], g.Labels[1], n)
		}
	}
	vars["forwarders"] = forwardersOn(map[string]cty.Value{"key_secret": cty.StringVal("relaybus-forwarders-key")})
	ev := c.newEvaluator(t, vars).withStubs()
	readers := map[string]bool{}
	for _, g := range grantsOf(t, c, ev, "google_secret_manager_secret_iam_member", "secret_id") {
		if g.target == "relaybus-forwarders-key" {
			readers[g.member] = true
		}
	}
	if !reflect.DeepEqual(readers, map[string]bool{"serviceAccount:relaybus-forwarders@relaybus-test.iam.gserviceaccount.com": true, dlqreplayMember: true}) {
		t.Errorf("the forwarders key is readable by %v, want dlqreplay and the forwarders service alone", readers)
	}
	if got := fmt.Sprint(jsonValue(t, ev.local("forwarders_key_secret"))); got != "[relaybus-forwarders-key]" {
		t.Errorf("local.forwarders_key_secret = %s, want the secret", got)
	}
	for _, name := range []string{"google_cloud_run_v2_service.forwarders", "google_cloud_run_v2_service.function"} {
		svc := c.resource(t, name)
		found := false
		for _, b := range block(t, name, block(t, name, svc.Body, "template"), "containers").Blocks {
			if b.Type != "dynamic" {
				continue
			}
			content := block(t, name, b.Body, "content")
			if n, ok := content.Attributes["name"]; ok && strings.Contains(c.exprSource(n.Expr), "RELAYBUS_FORWARDERS_KEY") {
				found = strings.Contains(c.exprSource(b.Body.Attributes["for_each"].Expr), "local.forwarders_key_secret")
			}
		}
		if !found {
			t.Errorf("%s: no env block sets RELAYBUS_FORWARDERS_KEY from local.forwarders_key_secret", name)
		}
	}
}
