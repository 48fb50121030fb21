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

		for g, res := range base {
			if _, kept := on[g]; !kept {
				t.Errorf("enabling the forwarders takes away %s (%s)", g, res)
			}
		}
		for g, res := range on {
			if _, before := base[g]; !before && !want[g] {
				t.Errorf("enabling the forwarders grants %s (%s), which is not theirs", g, res)
			}
		}
		for g := range want {
			if _, ok := on[g]; !ok {
				t.Errorf("enabling the forwarders does not grant %s", g)
			} else if _, before := base[g]; before {
				t.Errorf("%s is granted with the forwarders off", g)
			}
		}
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

// TestForwardersAreOffByDefaultAndRefusedOnNATS: by default, and on NATS
// even when asked for, no resource of forwarders.tf exists, dlqreplay is
// given no forwarders setting (so POST /forwarders answers 501, functions/
// dlqreplay's TestAddingAForwarderWhereNoneCanBeServedAnswers501) and no
// database role is made for it; asked for on NATS, or on a database the
// topology lacks, the plan is refused with the reason.
func TestForwardersAreOffByDefaultAndRefusedOnNATS(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	path, _ := repoTopology(t)
	pre := block(t, "terraform_data.forwarders", block(t, "terraform_data.forwarders", c.resource(t, "terraform_data.forwarders").Body, "lifecycle"), "precondition")
	for _, tc := range []struct {
		name   string
		vars   map[string]cty.Value
		refuse string
	}{
		{"by default", nil, ""},
		{"on NATS", map[string]cty.Value{"forwarders": forwardersOn(nil), "nats": cty.ObjectVal(map[string]cty.Value{"url": cty.StringVal("tls://nats.internal:4222")})}, "need Pub/Sub"},
		{"on an unknown database", map[string]cty.Value{"forwarders": forwardersOn(map[string]cty.Value{"database": cty.StringVal("orders")})}, `forwarders.database "orders" is not one of the topology's databases (main, member)`},
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
			if tc.name == "on an unknown database" {
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
