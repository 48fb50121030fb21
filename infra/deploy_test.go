package infra

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/zclconf/go-cty/cty"

	"github.com/relaybus/relaybus/shared/topology"
)

// dependsOn lists the references in a resource's depends_on.
func dependsOn(t testing.TB, b *hclsyntax.Block) []string {
	t.Helper()
	a, ok := b.Body.Attributes["depends_on"]
	if !ok {
		return nil
	}
	tuple, ok := a.Expr.(*hclsyntax.TupleConsExpr)
	if !ok {
		t.Fatalf("%s.%s: depends_on is not a list", b.Labels[0], b.Labels[1])
	}
	var out []string
	for _, e := range tuple.Exprs {
		out = append(out, refOf(e))
	}
	return out
}

// TestDeadLetterMonitorsPushToArchive: every <topic>.dlq-monitor pushes to
// dlqreplay's POST /deadletters:archive with an OIDC token of the dedicated
// push identity, which may invoke dlqreplay and is the only archiver
// dlqreplay accepts; nothing pulls the monitors any more.
func TestDeadLetterMonitorsPushToArchive(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		stubs := resourceStubs(t, ev)
		b := c.resource(t, "google_pubsub_subscription.dead_letter_monitor")
		monitors := forEachKeys(t, ev, b)
		if len(monitors) != len(top.Topics) {
			t.Errorf("%d monitors for %d topics", len(monitors), len(top.Topics))
		}
		dlqreplay := "https://relaybus-dlqreplay-test.a.run.app"
		push := "relaybus-dlq-push@relaybus-test.iam.gserviceaccount.com"
		for key, v := range monitors {
			in := newInstance(t, ev, stubs, "dead_letter_monitor", key, v)
			pc := block(t, key, b.Body, "push_config")
			if got := in.attr(pc, "push_endpoint").AsString(); got != dlqreplay+"/deadletters:archive" {
				t.Errorf("%s monitor pushes to %s, want %s/deadletters:archive", key, got, dlqreplay)
			}
			oidc := block(t, key, pc, "oidc_token")
			if got := in.attr(oidc, "service_account_email").AsString(); got != push {
				t.Errorf("%s monitor pushes as %s, want %s", key, got, push)
			}
			// The service's deterministic URL: Cloud Run's IAM takes it as
			// the service's own, and dlqreplay's DLQREPLAY_AUDIENCE names it.
			wantAudience := "https://relaybus-dlqreplay-" + stubProjectNumber + ".europe-west1.run.app"
			if got := in.attr(oidc, "audience").AsString(); got != wantAudience {
				t.Errorf("%s monitor audience %s, want the dlqreplay service's deterministic URL %s", key, got, wantAudience)
			}
			if got := in.attr(block(t, key, b.Body, "expiration_policy"), "ttl").AsString(); got != "" {
				t.Errorf("%s monitor expires (%q)", key, got)
			}
		}
		if !contains(dependsOn(t, b), "time_sleep.function_invoker_propagation") {
			t.Error("the monitors must wait for the push identity's invoker grant to propagate")
		}
		inv := c.resource(t, "google_cloud_run_v2_service_iam_member.dead_letter_push_invoker")
		if refOf(inv.Body.Attributes["name"].Expr) != "google_cloud_run_v2_service.function[dlqreplay]" || refOf(inv.Body.Attributes["member"].Expr) != "google_service_account.dead_letter_push" {
			t.Error("the DLQ push identity is not dlqreplay's invoker")
		}
		wired := jsonValue(t, ev.local("function_wired_env")).(map[string]any)
		if got := wired["dlqreplay"].(map[string]any)["DLQREPLAY_ARCHIVERS"]; got != push {
			t.Errorf("DLQREPLAY_ARCHIVERS %v, want %s", got, push)
		}
	})
	c := loadTerraform(t, terraformDir(t))
	for _, key := range c.resourcesOfType("google_pubsub_subscription_iam_member") {
		if strings.Contains(c.exprSourceOfBlock(c.resources[key]), "dead_letter_monitor") {
			t.Errorf("%s: nobody pulls the DLQ monitors (they push to dlqreplay)", key)
		}
	}
}

// TestServiceIdentitiesAndPropagationWaits: the Pub/Sub and Eventarc
// service agents are created (beta provider), the Eventarc agent has its
// role, providers are pinned, and every wait stands before what needs it
// and covers the grants it waits for.
func TestServiceIdentitiesAndPropagationWaits(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	for name, service := range map[string]string{"pubsub": "pubsub.googleapis.com", "eventarc": "eventarc.googleapis.com"} {
		b := c.resource(t, "google_project_service_identity."+name)
		if got := c.exprSource(b.Body.Attributes["provider"].Expr); got != "google-beta" {
			t.Errorf("service identity %s: provider %s; the resource exists in google-beta only", name, got)
		}
		if v, _ := b.Body.Attributes["service"].Expr.Value(nil); v.AsString() != service {
			t.Errorf("service identity %s: service %s", name, v.AsString())
		}
		if !contains(dependsOn(t, b), "time_sleep.api_propagation") {
			t.Errorf("service identity %s does not wait for the APIs", name)
		}
	}
	agent := c.resource(t, "google_project_iam_member.eventarc_agent")
	if v, _ := agent.Body.Attributes["role"].Expr.Value(nil); v.AsString() != "roles/eventarc.serviceAgent" {
		t.Errorf("eventarc agent role %s", v.AsString())
	}
	if got := c.exprSource(c.locals["eventarc_service_agent"].Expr); got != "google_project_service_identity.eventarc.member" {
		t.Errorf("local.eventarc_service_agent is %s", got)
	}

	// Pinned providers, exactly.
	var required *hclsyntax.Body
	for _, b := range c.files["versions.tf"].Blocks {
		if b.Type == "terraform" {
			required = block(t, "terraform", b.Body, "required_providers")
		}
	}
	for name, source := range map[string]string{"google": "hashicorp/google", "google-beta": "hashicorp/google-beta", "time": "hashicorp/time", "random": "hashicorp/random"} {
		a, ok := required.Attributes[name]
		if !ok {
			t.Errorf("provider %s is not required", name)
			continue
		}
		v, diags := a.Expr.Value(nil)
		if diags.HasErrors() {
			t.Fatal(diags.Error())
		}
		if v.GetAttr("source").AsString() != source || !regexp.MustCompile(`^= \d+\.\d+\.\d+$`).MatchString(v.GetAttr("version").AsString()) {
			t.Errorf("provider %s: %s %s, want %s pinned to one version (= x.y.z)", name, v.GetAttr("source").AsString(), v.GetAttr("version").AsString(), source)
		}
	}

	// Each dependant waits for its wait.
	waits := map[string][]string{
		"google_cloud_run_v2_service.function":                {"time_sleep.iam_propagation"},
		"google_cloud_run_v2_service.consume":                 {"time_sleep.iam_propagation"},
		"terraform_data.sync_consumers":                       {"time_sleep.iam_propagation"},
		"google_eventarc_trigger.consumer":                    {"time_sleep.iam_propagation", "time_sleep.consume_invoker_propagation"},
		"google_eventarc_trigger.rollup":                      {"time_sleep.iam_propagation", "time_sleep.function_invoker_propagation"},
		"google_pubsub_subscription.consumer":                 {"time_sleep.iam_propagation", "time_sleep.consume_invoker_propagation"},
		"google_pubsub_subscription.rollup":                   {"time_sleep.function_invoker_propagation"},
		"google_pubsub_subscription.dead_letter_monitor":      {"time_sleep.function_invoker_propagation"},
		"google_cloud_scheduler_job.relay":                    {"time_sleep.function_invoker_propagation", "terraform_data.sync_consumers"},
		"google_cloud_scheduler_job.reconcile":                {"time_sleep.function_invoker_propagation"},
		"google_cloud_scheduler_job.expire":                   {"time_sleep.function_invoker_propagation"},
		"google_cloud_scheduler_job.ledger_ship":              {"time_sleep.consume_invoker_propagation"},
		"google_cloud_scheduler_job.inbox_purge":              {"time_sleep.consume_invoker_propagation"},
		"google_cloud_scheduler_job.gaps_check":               {"time_sleep.consume_invoker_propagation"},
		"google_cloud_scheduler_job.breaker_probe":            {"time_sleep.consume_invoker_propagation"},
		"google_cloud_scheduler_job.forwarders_ledger_ship":   {"time_sleep.consume_invoker_propagation"},
		"google_cloud_scheduler_job.forwarders_breaker_probe": {"time_sleep.consume_invoker_propagation"},
		"google_cloud_scheduler_job.forwarders_inbox_purge":   {"time_sleep.consume_invoker_propagation"},
		"google_cloud_run_v2_service.forwarders":              {"time_sleep.iam_propagation"},
	}
	for key, want := range waits {
		got := dependsOn(t, c.resource(t, key))
		for _, w := range want {
			if !contains(got, w) {
				t.Errorf("%s does not wait for %s (depends_on %v)", key, w, got)
			}
		}
	}
	for _, key := range c.resourcesOfType("google_cloud_scheduler_job") {
		if _, listed := waits[key]; !listed {
			t.Errorf("%s: no propagation wait is checked for this job", key)
		}
	}
	for _, key := range c.resourcesOfType("google_monitoring_alert_policy") {
		b := c.resources[key]
		if strings.Contains(c.exprSourceOfBlock(b), "google_logging_metric.") && !contains(dependsOn(t, b), "time_sleep.log_metrics") {
			t.Errorf("%s reads a log-based metric but does not wait for time_sleep.log_metrics (provider issue #11102)", key)
		}
	}

	// Each wait covers the grants it stands for.
	covers := func(wait string, keys []string) {
		t.Helper()
		src := c.exprSourceOfBlock(c.resource(t, wait))
		for _, k := range keys {
			if !strings.Contains(src, k+" ") && !strings.Contains(src, k+".") && !strings.Contains(src, k+"[") {
				t.Errorf("%s does not wait for %s", wait, k)
			}
		}
	}
	var first []string
	for _, typ := range []string{"google_secret_manager_secret_iam_member", "google_service_account_iam_member"} {
		first = append(first, c.resourcesOfType(typ)...)
	}
	for _, key := range c.resourcesOfType("google_project_iam_member") {
		if key != "google_project_iam_member.dlqreplay_snapshots" {
			first = append(first, key)
		}
	}
	covers("time_sleep.iam_propagation", first)
	covers("time_sleep.consume_invoker_propagation", []string{
		"google_cloud_run_v2_service_iam_member.consume_invoker", "google_cloud_run_v2_service_iam_member.scheduler_consume_invoker",
		"google_cloud_run_v2_service_iam_member.forwarders_push_invoker", "google_cloud_run_v2_service_iam_member.scheduler_forwarders_invoker",
	})
	covers("time_sleep.function_invoker_propagation", []string{
		"google_cloud_run_v2_service_iam_member.rollup_invoker", "google_cloud_run_v2_service_iam_member.scheduler_invoker",
		"google_cloud_run_v2_service_iam_member.dead_letter_push_invoker",
	})
	covers("time_sleep.log_metrics", c.resourcesOfType("google_logging_metric"))
}

// TestCloudSQL: every service that opens a Cloud SQL database mounts the
// Cloud SQL volume and holds Cloud SQL Client; the URL in each database's
// secret is one pgx parses to the socket directory, the database, the user
// and the pool size; the pools fit the instance's connection limit; a
// database with an external URL secret gets none of it.
func TestCloudSQL(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	path, top := repoTopology(t)

	t.Run("every database in Cloud SQL", func(t *testing.T) {
		vars := requiredVars(t)
		vars["topology_file"] = cty.StringVal(path)
		ev := c.newEvaluator(t, vars).withStubs()
		usesFn := jsonValue(t, ev.local("function_uses_cloudsql")).(map[string]any)
		for f, want := range map[string]bool{"publish": true, "relay": true, "dlqreplay": true, "rollup": false} {
			if usesFn[f] != want {
				t.Errorf("%s mounts Cloud SQL: %v, want %v", f, usesFn[f], want)
			}
		}
		usesConsume := jsonValue(t, ev.local("consume_uses_cloudsql")).(map[string]any)
		for _, cs := range top.Consumers() {
			if usesConsume[cs.Subscription()] != true {
				t.Errorf("consume %s does not mount Cloud SQL", cs.Subscription())
			}
		}
		for _, key := range []string{"google_cloud_run_v2_service.function", "google_cloud_run_v2_service.consume"} {
			src := squeeze(c.exprSourceOfBlock(c.resource(t, key)))
			for _, want := range []string{
				`dynamic "volumes" {`, `name = "cloudsql" cloud_sql_instance { instances = [volumes.value] }`,
				`? [local.cloudsql_connection_name] : []`,
				`dynamic "volume_mounts" {`, `mount_path = "/cloudsql"`,
			} {
				if !strings.Contains(src, want) {
					t.Errorf("%s: no %s", key, want)
				}
			}
		}
		if got := ev.local("cloudsql_connection_name").AsString(); got != stubConnectionName {
			t.Errorf("connection name %s", got)
		}
		if got := sortedKeys(forEachKeys(t, ev, c.resource(t, "google_project_iam_member.cloudsql_client"))); strings.Join(got, ",") != "dlqreplay,publish,relay" {
			t.Errorf("Cloud SQL Client for %v, want dlqreplay, publish, relay", got)
		}
		if got := len(forEachKeys(t, ev, c.resource(t, "google_project_iam_member.consume_cloudsql_client"))); got != len(top.Consumers()) {
			t.Errorf("Cloud SQL Client for %d consumers, want %d", got, len(top.Consumers()))
		}
		for _, key := range []string{"google_project_iam_member.cloudsql_client", "google_project_iam_member.consume_cloudsql_client"} {
			if v, _ := c.resource(t, key).Body.Attributes["role"].Expr.Value(nil); v.AsString() != "roles/cloudsql.client" {
				t.Errorf("%s: role %s", key, v.AsString())
			}
		}

		// One secret per database, holding a URL pgx understands.
		secrets := jsonValue(t, ev.local("database_secret_ids")).(map[string]any)
		urls := ev.local("cloudsql_urls")
		for _, d := range top.Databases {
			if secrets[d.Name] != "relaybus-database-url-"+d.Name {
				t.Errorf("database %s: secret %v", d.Name, secrets[d.Name])
			}
			u := urls.GetAttr(d.Name).AsString()
			cfg, err := pgxpool.ParseConfig(u)
			if err != nil {
				t.Fatalf("database %s: pgx cannot parse its URL: %v", d.Name, err)
			}
			want := "relaybus_" + strings.ReplaceAll(d.Name, "-", "_")
			if cfg.ConnConfig.Host != "/cloudsql/"+stubConnectionName || cfg.ConnConfig.Database != want || cfg.ConnConfig.User != want ||
				cfg.ConnConfig.Password != stubPassword(d.Name) || cfg.MaxConns != 5 || cfg.ConnConfig.TLSConfig != nil {
				t.Errorf("database %s: pgx reads host %q, database %q, user %q, pool %d, TLS %v; want the Cloud SQL socket directory, %s, pool 5, no TLS on the socket",
					d.Name, cfg.ConnConfig.Host, cfg.ConnConfig.Database, cfg.ConnConfig.User, cfg.MaxConns, cfg.ConnConfig.TLSConfig != nil, want)
			}
		}

		// The arithmetic of database.tf, recomputed here from the topology.
		conns := jsonValue(t, ev.local("database_connections")).(map[string]any)
		total := 0
		for _, d := range top.Databases {
			instances := 3 + 2 // relay, dlqreplay
			if d.Name == topology.MainDatabase {
				instances += 20 // publish
			}
			for _, cs := range top.Consumers() {
				if cs.Database == d.Name {
					instances += 10
				}
			}
			if conns[d.Name] != jsonNum(5*instances) {
				t.Errorf("database %s: %v connections, want 5 × %d", d.Name, conns[d.Name], instances)
			}
			total += 5 * instances
		}
		if got := ev.local("cloudsql_connections"); !got.RawEquals(cty.NumberIntVal(int64(total))) {
			t.Errorf("cloudsql_connections %#v, want %d", got, total)
		}
		check := c.resource(t, "terraform_data.database_connections")
		cond := block(t, "database_connections", block(t, "database_connections", check.Body, "lifecycle"), "precondition").Attributes["condition"].Expr
		if v, diags := ev.eval(cond, nil); diags.HasErrors() || !v.True() {
			t.Errorf("the default pools (%d connections) do not fit the default instance: %v", total, diags)
		}
		vars["cloud_sql"] = cty.ObjectVal(map[string]cty.Value{"max_connections": cty.NumberIntVal(int64(total))})
		small := c.newEvaluator(t, vars).withStubs()
		if v, diags := small.eval(cond, nil); diags.HasErrors() || v.True() {
			t.Errorf("%d connections within max_connections %d − 20 reserved pass the check", total, total)
		}

		inst := c.resource(t, "google_sql_database_instance.relaybus")
		src := squeeze(c.exprSourceOfBlock(inst))
		for _, want := range []string{`name = "max_connections" value = tostring(var.cloud_sql.max_connections)`, `ssl_mode = "ENCRYPTED_ONLY"`, `ipv4_enabled = true`} {
			if !strings.Contains(src, want) {
				t.Errorf("Cloud SQL instance: no %s", want)
			}
		}
		if strings.Contains(src, "authorized_networks") {
			t.Error("Cloud SQL instance: authorized networks open it beyond the Cloud SQL connectors")
		}
	})

	t.Run("member database elsewhere", func(t *testing.T) {
		vars := requiredVars(t)
		vars["topology_file"] = cty.StringVal(path)
		vars["database_url_secrets"] = cty.MapVal(map[string]cty.Value{"member": cty.StringVal("member-database-url")})
		ev := c.newEvaluator(t, vars).withStubs()
		if got := sortedKeys(jsonValue(t, ev.local("cloudsql_databases")).(map[string]any)); strings.Join(got, ",") != "main" {
			t.Errorf("Cloud SQL databases %v, want main only", got)
		}
		secrets := jsonValue(t, ev.local("database_secret_ids")).(map[string]any)
		if secrets["member"] != "member-database-url" || secrets["main"] != "relaybus-database-url-main" {
			t.Errorf("secrets %v", secrets)
		}
		usesConsume := jsonValue(t, ev.local("consume_uses_cloudsql")).(map[string]any)
		for _, cs := range top.Consumers() {
			if want := cs.Database != "member"; usesConsume[cs.Subscription()] != want {
				t.Errorf("consume %s (database %s) mounts Cloud SQL: %v", cs.Subscription(), cs.Database, usesConsume[cs.Subscription()])
			}
		}
	})

	t.Run("no database in Cloud SQL", func(t *testing.T) {
		vars := requiredVars(t)
		vars["topology_file"] = cty.StringVal(path)
		all := map[string]cty.Value{}
		for _, d := range top.Databases {
			all[d.Name] = cty.StringVal(d.Name + "-url")
		}
		vars["database_url_secrets"] = cty.MapVal(all)
		ev := c.newEvaluator(t, vars).withStubs()
		if ev.local("use_cloud_sql").True() || ev.local("cloudsql_connection_name").AsString() != "" {
			t.Error("an instance is used although every database is external")
		}
		if got := len(forEachKeys(t, ev, c.resource(t, "google_project_iam_member.cloudsql_client"))); got != 0 {
			t.Errorf("%d Cloud SQL Client grants without Cloud SQL", got)
		}
	})
}

// TestFirestoreTTL: a TTL policy on deleteAt of events, event_consumptions
// (each event's attempts: TTL does not delete subcollections) and
// dead_letters, each with its single-field indexes off.
func TestFirestoreTTL(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	ev := c.newEvaluator(t, nil)
	ttl := jsonValue(t, ev.local("ttl_fields")).(map[string]any)
	want := []string{"dead_letters/deleteAt", "event_consumptions/deleteAt", "events/deleteAt"}
	if got := sortedKeys(ttl); !reflect.DeepEqual(got, want) {
		t.Errorf("TTL fields %v, want %v", got, want)
	}
	b := c.resource(t, "google_firestore_field.ttl")
	if fe := c.exprSource(b.Body.Attributes["for_each"].Expr); fe != "local.ttl_fields" {
		t.Errorf("google_firestore_field.ttl for_each %s", fe)
	}
	for _, name := range []string{"ttl_config", "index_config"} {
		if body := block(t, "ttl", b.Body, name); len(body.Attributes)+len(body.Blocks) != 0 {
			t.Errorf("google_firestore_field.ttl: %s must be empty (a TTL policy; no single-field index)", name)
		}
	}
}

// TestAlertAggregationsMatchMetricKinds: every alert condition's aligner is
// valid for its metric's kind and value type, and its reducer for the
// aligned values (the Monitoring API answers 400 otherwise). The rules are
// those of google.monitoring.v3.Aggregation's Aligner and Reducer
// (https://cloud.google.com/monitoring/api/ref_v3/rest/v3/projects.alertPolicies#Aligner).
func TestAlertAggregationsMatchMetricKinds(t *testing.T) {
	type kind struct{ metric, value string }
	numeric := func(v string) bool { return v == "INT64" || v == "DOUBLE" }
	// Built-in metrics the policies read (Pub/Sub's metric list,
	// https://cloud.google.com/monitoring/api/metrics_gcp_p_z#gcp-pubsub).
	metrics := map[string]kind{
		"pubsub.googleapis.com/subscription/num_undelivered_messages":   {"GAUGE", "INT64"},
		"pubsub.googleapis.com/subscription/oldest_unacked_message_age": {"GAUGE", "INT64"},
		"pubsub.googleapis.com/subscription/dead_letter_message_count":  {"DELTA", "INT64"},
		"pubsub.googleapis.com/subscription/push_request_count":         {"DELTA", "INT64"},
	}
	c := loadTerraform(t, terraformDir(t))
	for _, key := range c.resourcesOfType("google_logging_metric") {
		b := c.resources[key]
		md := block(t, key, b.Body, "metric_descriptor")
		mk, _ := md.Attributes["metric_kind"].Expr.Value(nil)
		vt, _ := md.Attributes["value_type"].Expr.Value(nil)
		metrics["log:"+b.Labels[1]] = kind{mk.AsString(), vt.AsString()}
	}
	align := func(a string, in kind) (kind, bool) {
		gd := in.metric == "GAUGE" || in.metric == "DELTA"
		switch {
		case a == "ALIGN_NONE":
			return in, true
		case a == "ALIGN_DELTA":
			return kind{"DELTA", in.value}, in.metric == "CUMULATIVE" || in.metric == "DELTA"
		case a == "ALIGN_RATE":
			return kind{"GAUGE", "DOUBLE"}, (in.metric == "CUMULATIVE" || in.metric == "DELTA") && numeric(in.value)
		case a == "ALIGN_MIN", a == "ALIGN_MAX":
			return in, gd && numeric(in.value)
		case a == "ALIGN_MEAN", a == "ALIGN_STDDEV":
			return kind{in.metric, "DOUBLE"}, gd && numeric(in.value)
		case a == "ALIGN_COUNT":
			return kind{in.metric, "INT64"}, gd && (numeric(in.value) || in.value == "BOOL")
		case a == "ALIGN_SUM":
			return in, gd && (numeric(in.value) || in.value == "DISTRIBUTION")
		case strings.HasPrefix(a, "ALIGN_PERCENTILE_"):
			return kind{"GAUGE", "DOUBLE"}, gd && in.value == "DISTRIBUTION"
		case a == "ALIGN_COUNT_TRUE", a == "ALIGN_COUNT_FALSE", a == "ALIGN_FRACTION_TRUE":
			return kind{"GAUGE", "INT64"}, in.metric == "GAUGE" && in.value == "BOOL"
		}
		return in, false
	}
	reduce := func(r string, in kind) bool {
		switch r {
		case "", "REDUCE_NONE", "REDUCE_COUNT":
			return true
		case "REDUCE_MIN", "REDUCE_MAX":
			return numeric(in.value)
		case "REDUCE_SUM", "REDUCE_MEAN", "REDUCE_STDDEV":
			return numeric(in.value) || in.value == "DISTRIBUTION"
		}
		return strings.HasPrefix(r, "REDUCE_PERCENTILE_") && (numeric(in.value) || in.value == "DISTRIBUTION")
	}
	logMetric := regexp.MustCompile(`logging\.googleapis\.com/user/\$\{google_logging_metric\.(\w+)\.name\}`)
	builtin := regexp.MustCompile(`metric\.type = \\"([a-z./_]+)\\"`)
	checked := 0
	for _, key := range c.resourcesOfType("google_monitoring_alert_policy") {
		for _, cond := range c.resources[key].Body.Blocks {
			if cond.Type != "conditions" {
				continue
			}
			for _, inner := range cond.Body.Blocks {
				if inner.Type != "condition_threshold" && inner.Type != "condition_absent" {
					continue
				}
				filter := c.exprSource(inner.Body.Attributes["filter"].Expr)
				var metric string
				if m := logMetric.FindStringSubmatch(filter); m != nil {
					metric = "log:" + m[1]
				} else if m := builtin.FindStringSubmatch(filter); m != nil {
					metric = m[1]
				}
				k, ok := metrics[metric]
				if !ok {
					t.Errorf("%s: condition reads a metric this test does not know (%q in %s)", key, metric, filter)
					continue
				}
				agg := block(t, key, inner.Body, "aggregations")
				aligner, _ := agg.Attributes["per_series_aligner"].Expr.Value(nil)
				reducer := ""
				if r, ok := agg.Attributes["cross_series_reducer"]; ok {
					v, _ := r.Expr.Value(nil)
					reducer = v.AsString()
				}
				out, ok := align(aligner.AsString(), k)
				if !ok {
					t.Errorf("%s: %s on %s (%s %s): not a valid aligner for that kind", key, aligner.AsString(), metric, k.metric, k.value)
				}
				if !reduce(reducer, out) || (reducer != "" && reducer != "REDUCE_NONE" && aligner.AsString() == "ALIGN_NONE") {
					t.Errorf("%s: %s after %s on %s: not a valid reducer for %s values", key, reducer, aligner.AsString(), metric, out.value)
				}
				checked++
			}
		}
	}
	if checked < 8 {
		t.Errorf("checked %d alert conditions; the policies were not found", checked)
	}
	if got := metrics["log:outbox_backlog"]; got != (kind{"DELTA", "DISTRIBUTION"}) {
		t.Errorf("outbox_backlog is %v; this test expects the DELTA DISTRIBUTION it guards", got)
	}
}

// TestEventarcSubscriptionMap: every consumer's logical subscription id maps
// to the subscription Pub/Sub really has (the trigger's for Eventarc
// consumers), one to one, and dlqreplay gets the map as
// DLQREPLAY_SUBSCRIPTIONS; mapped back it names the topology's consumer.
func TestEventarcSubscriptionMap(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		ids := jsonValue(t, ev.local("consumer_subscription_ids")).(map[string]any)
		consumers := jsonValue(t, ev.local("consumers")).(map[string]any)
		back := map[string]string{}
		for _, cs := range top.Consumers() {
			want := cs.Subscription()
			if cs.Delivery == topology.DeliveryEventarc {
				want = stubEventarcSubscription(consumers[cs.Subscription()].(map[string]any)["run_service"].(string))
			}
			if ids[cs.Subscription()] != want {
				t.Errorf("%s (%s) maps to %v, want %s", cs.Subscription(), cs.Delivery, ids[cs.Subscription()], want)
			}
			back[want] = cs.Subscription()
		}
		if len(ids) != len(top.Consumers()) || len(back) != len(ids) {
			t.Errorf("map %v is not one to one over the topology's %d consumers", ids, len(top.Consumers()))
		}
		for real, logical := range back {
			cs, ok := top.Consumer(logical)
			if !ok || ids[cs.Subscription()] != real {
				t.Errorf("dead letters from %s do not map back to a consumer", real)
			}
		}
		wired := jsonValue(t, ev.local("function_wired_env")).(map[string]any)
		var fromEnv map[string]any
		if err := json.Unmarshal([]byte(wired["dlqreplay"].(map[string]any)["DLQREPLAY_SUBSCRIPTIONS"].(string)), &fromEnv); err != nil {
			t.Fatalf("DLQREPLAY_SUBSCRIPTIONS is not JSON: %v", err)
		}
		if !reflect.DeepEqual(fromEnv, ids) {
			t.Errorf("DLQREPLAY_SUBSCRIPTIONS %v, want %v", fromEnv, ids)
		}
	})
	raw, err := os.ReadFile(filepath.Join(terraformDir(t), "outputs.tf"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(squeeze(string(raw)), `output "subscriptions" {`) || !strings.Contains(string(raw), "value       = local.consumer_subscription_ids") {
		t.Error(`output "subscriptions" does not print local.consumer_subscription_ids`)
	}
}

// TestTopologyNamingRulesAgreeWithGo: Terraform's plan-time naming check
// (local.naming_errors, terraform_data.topology's precondition) refuses
// exactly what shared/topology refuses, for names on either side of each
// rule.
func TestTopologyNamingRulesAgreeWithGo(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	pre := block(t, "topology", block(t, "topology", c.resource(t, "terraform_data.topology").Body, "lifecycle"), "precondition")
	if got := c.exprSource(pre.Attributes["condition"].Expr); got != "length(local.naming_errors) == 0" {
		t.Errorf("terraform_data.topology precondition %s", got)
	}
	for _, key := range []string{"google_pubsub_topic.topic", "google_pubsub_topic.dead_letter", "google_pubsub_topic.rollup"} {
		if !contains(dependsOn(t, c.resource(t, key)), "terraform_data.topology") {
			t.Errorf("%s is created before the naming check", key)
		}
	}
	long := func(n int) string { return "a" + strings.Repeat("b", n-1) }
	type names struct {
		topic, service, role, database string
		valid                          bool
	}
	ok := names{"shop.order.events", "member-service", "processor", "member", true}
	cases := map[string]names{
		"valid":                  ok,
		"two segments":           {"shop.orders", ok.service, ok.role, ok.database, true},
		"four segments":          {"shop.order.events.v2", ok.service, ok.role, ok.database, false},
		"one segment":            {"orders", ok.service, ok.role, ok.database, false},
		"upper case topic":       {"Shop.order.events", ok.service, ok.role, ok.database, false},
		"underscore topic":       {"shop.order_x.events", ok.service, ok.role, ok.database, false},
		"dlq segment":            {"shop.dlq.events", ok.service, ok.role, ok.database, false},
		"digit first":            {"shop.1order.events", ok.service, ok.role, ok.database, false},
		"segment of 63":          {"shop." + long(63) + ".events", ok.service, ok.role, ok.database, true},
		"segment of 64":          {"shop." + long(64) + ".events", ok.service, ok.role, ok.database, false},
		"service ends in hyphen": {ok.topic, "member-", ok.role, ok.database, false},
		"service upper case":     {ok.topic, "Member", ok.role, ok.database, false},
		"service of 63":          {ok.topic, long(63), ok.role, ok.database, true},
		"service of 64":          {ok.topic, long(64), ok.role, ok.database, false},
		"role with hyphen":       {ok.topic, ok.service, "proc-essor", ok.database, false},
		"role of 30":             {ok.topic, ok.service, long(30), ok.database, true},
		"role of 31":             {ok.topic, ok.service, long(31), ok.database, false},
		"database with hyphen":   {ok.topic, ok.service, ok.role, "member-db", true},
		"database ends hyphen":   {ok.topic, ok.service, ok.role, "member-", false},
		"database upper case":    {ok.topic, ok.service, ok.role, "Member", false},
		"database underscore":    {ok.topic, ok.service, ok.role, "member_db", false},
		"database of 30":         {ok.topic, ok.service, ok.role, long(30), true},
		"database of 31":         {ok.topic, ok.service, ok.role, long(31), false},
		"database digit first":   {ok.topic, ok.service, ok.role, "1member", false},
	}
	for name, n := range cases {
		t.Run(name, func(t *testing.T) {
			doc := "rollup: {topic: relaybus.ledger.rollup}\n" +
				"databases:\n  - name: main\n  - name: " + n.database + "\n" +
				"topics:\n  - name: " + n.topic + "\n    consumers:\n      - service: " + n.service + "\n        role: " + n.role + "\n        database: " + n.database + "\n"
			_, goErr := topology.Parse([]byte(doc))
			path := filepath.Join(t.TempDir(), "topology.yaml")
			if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			ev := c.newEvaluator(t, map[string]cty.Value{"topology_file": cty.StringVal(path)})
			tfErrs := jsonValue(t, ev.local("naming_errors")).([]any)
			if (goErr != nil) != (len(tfErrs) > 0) {
				t.Errorf("shared/topology: %v; Terraform: %v", goErr, tfErrs)
			}
			if n.valid != (goErr == nil) {
				t.Errorf("case %q (valid: %v): shared/topology says %v", name, n.valid, goErr)
			}
		})
	}
	// The repository's topology passes.
	path, _ := repoTopology(t)
	ev := c.newEvaluator(t, map[string]cty.Value{"topology_file": cty.StringVal(path)})
	if errs := jsonValue(t, ev.local("naming_errors")).([]any); len(errs) != 0 {
		t.Errorf("infra/topology.yaml: %v", errs)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestNoDependencyCycle: the resources' references (through locals and
// depends_on) form no cycle, which `terraform plan` would refuse. The graph
// is built from the HCL the way Terraform builds it, at resource level.
func TestNoDependencyCycle(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	refsOf := func(body *hclsyntax.Body) []string {
		var out []string
		var walk func(b *hclsyntax.Body)
		walk = func(b *hclsyntax.Body) {
			for _, a := range b.Attributes {
				for _, tr := range a.Expr.Variables() {
					out = append(out, traversalName(tr))
				}
			}
			for _, blk := range b.Blocks {
				walk(blk.Body)
			}
		}
		walk(body)
		return out
	}
	// Locals resolved to the resources they refer to.
	localRefs := map[string][]string{}
	var resolve func(name string, seen map[string]bool) []string
	resolve = func(name string, seen map[string]bool) []string {
		if r, ok := localRefs[name]; ok {
			return r
		}
		if seen[name] {
			t.Fatalf("local.%s refers to itself", name)
		}
		seen[name] = true
		var out []string
		a, ok := c.locals[name]
		if !ok {
			t.Fatalf("local.%s is not declared", name)
		}
		for _, tr := range a.Expr.Variables() {
			n := traversalName(tr)
			if strings.HasPrefix(n, "local.") {
				out = append(out, resolve(strings.TrimPrefix(n, "local."), seen)...)
			} else if n != "" {
				out = append(out, n)
			}
		}
		localRefs[name] = out
		return out
	}
	edges := map[string]map[string]bool{}
	for key, b := range c.resources {
		edges[key] = map[string]bool{}
		for _, n := range refsOf(b.Body) {
			var targets []string
			if strings.HasPrefix(n, "local.") {
				targets = resolve(strings.TrimPrefix(n, "local."), map[string]bool{})
			} else {
				targets = []string{n}
			}
			for _, tgt := range targets {
				if _, isResource := c.resources[tgt]; isResource && tgt != key {
					edges[key][tgt] = true
				}
			}
		}
	}
	state := map[string]int{} // 1 visiting, 2 done
	var path []string
	var visit func(n string)
	visit = func(n string) {
		switch state[n] {
		case 1:
			i := 0
			for path[i] != n {
				i++
			}
			t.Fatalf("dependency cycle: %s -> %s", strings.Join(path[i:], " -> "), n)
		case 2:
			return
		}
		state[n] = 1
		path = append(path, n)
		for _, m := range sortedKeys(edges[n]) {
			visit(m)
		}
		path = path[:len(path)-1]
		state[n] = 2
	}
	for _, n := range sortedKeys(edges) {
		visit(n)
	}
}

// traversalName is "type.name" for a resource reference, "local.x" for a
// local, "" for anything else (var, each, count, path, self, data sources).
func traversalName(tr hcl.Traversal) string {
	root := tr.RootName()
	switch root {
	case "var", "each", "count", "path", "self", "terraform", "data":
		return ""
	}
	if len(tr) < 2 {
		return ""
	}
	a, ok := tr[1].(hcl.TraverseAttr)
	if !ok {
		return ""
	}
	return root + "." + a.Name
}
