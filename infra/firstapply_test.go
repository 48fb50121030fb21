package infra

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/zclconf/go-cty/cty"

	"github.com/relaybus/relaybus/shared/topology"
)

// The findings a first `terraform apply` on a fresh project ran into.

// TestPromQLAlertsSkipMetricValidation: every PromQL alert condition turns
// metric validation off. Cloud Monitoring refuses a PromQL condition whose
// metric does not exist yet unless disableMetricValidation is set, and on a
// fresh project the alert is created minutes before the first event: the
// first apply failed on google_monitoring_alert_policy.end_to_end_latency.
func TestPromQLAlertsSkipMetricValidation(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	found := 0
	for _, key := range c.resourcesOfType("google_monitoring_alert_policy") {
		for _, cond := range c.resources[key].Body.Blocks {
			if cond.Type != "conditions" {
				continue
			}
			for _, inner := range cond.Body.Blocks {
				if inner.Type != "condition_prometheus_query_language" {
					continue
				}
				found++
				a, ok := inner.Body.Attributes["disable_metric_validation"]
				if !ok {
					t.Errorf("%s: a PromQL condition without disable_metric_validation fails on a project that has not exported the metric yet", key)
					continue
				}
				if v, diags := a.Expr.Value(nil); diags.HasErrors() || !v.True() {
					t.Errorf("%s: disable_metric_validation = %s", key, c.exprSource(a.Expr))
				}
			}
		}
	}
	if found < 2 {
		t.Errorf("found %d PromQL conditions; want the end-to-end latency and the projection version lag alerts", found)
	}
}

// resourceEdges is the configuration's dependency graph at resource level:
// what each resource refers to (through locals too) or names in depends_on.
func resourceEdges(t *testing.T, c *tfConfig) map[string]map[string]bool {
	t.Helper()
	localRefs := map[string][]string{}
	var resolve func(name string, seen map[string]bool) []string
	resolve = func(name string, seen map[string]bool) []string {
		if r, ok := localRefs[name]; ok {
			return r
		}
		if seen[name] {
			return nil
		}
		seen[name] = true
		var out []string
		for _, tr := range c.locals[name].Expr.Variables() {
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
		var walk func(body *hclsyntax.Body)
		walk = func(body *hclsyntax.Body) {
			for _, a := range body.Attributes {
				for _, tr := range a.Expr.Variables() {
					n := traversalName(tr)
					targets := []string{n}
					if strings.HasPrefix(n, "local.") {
						targets = resolve(strings.TrimPrefix(n, "local."), map[string]bool{})
					}
					for _, tgt := range targets {
						if _, ok := c.resources[tgt]; ok && tgt != key {
							edges[key][tgt] = true
						}
					}
				}
			}
			for _, blk := range body.Blocks {
				walk(blk.Body)
			}
		}
		walk(b.Body)
	}
	return edges
}

// reaches reports whether from depends on to, directly or through others.
func reaches(edges map[string]map[string]bool, from, to string) bool {
	seen := map[string]bool{}
	stack := []string{from}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for m := range edges[n] {
			if m == to {
				return true
			}
			if !seen[m] {
				seen[m] = true
				stack = append(stack, m)
			}
		}
	}
	return false
}

// TestMonitoringWaitsForItsAPIs: every dashboard, alert policy and
// log-based metric is created after the Monitoring, Logging and Telemetry
// APIs are enabled and their propagation wait has passed; they waited on
// nothing, so a fresh project's first apply raced the enablement.
func TestMonitoringWaitsForItsAPIs(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	edges := resourceEdges(t, c)
	var checked []string
	for _, typ := range []string{"google_monitoring_alert_policy", "google_monitoring_dashboard", "google_logging_metric"} {
		for _, key := range c.resourcesOfType(typ) {
			checked = append(checked, key)
			if !reaches(edges, key, "time_sleep.api_propagation") {
				t.Errorf("%s does not wait for the APIs (time_sleep.api_propagation)", key)
			}
		}
	}
	if len(checked) < 10 {
		t.Errorf("checked %d monitoring resources", len(checked))
	}
	for _, api := range []string{"google_project_service.api", "google_project_service.telemetry"} {
		if !edges["time_sleep.api_propagation"][api] {
			t.Errorf("time_sleep.api_propagation does not wait for %s", api)
		}
	}
}

// TestEveryExportingFunctionMayWriteTelemetry: every function that exports
// (all five: rollup records the ledger hop and its fold, dlqreplay the forced
// replay spans) holds the trace and metric writer roles, and, because the
// exporter names the project as its quota project (x-goog-user-project),
// serviceusage.services.use (roles/serviceusage.serviceUsageConsumer), which
// Google's Telemetry API requires of the sender. With export off, none.
func TestEveryExportingFunctionMayWriteTelemetry(t *testing.T) {
	roles := []string{"roles/cloudtrace.agent", "roles/monitoring.metricWriter", "roles/serviceusage.serviceUsageConsumer"}
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		have := map[string]bool{}
		for _, g := range grantsOf(t, c, ev, "google_project_iam_member", "project") {
			have[g.member+" "+g.role] = true
		}
		members := []string{}
		for _, f := range []string{"publish", "relay", "rollup", "dlqreplay"} {
			members = append(members, "serviceAccount:relaybus-"+f+"@relaybus-test.iam.gserviceaccount.com")
		}
		for _, cs := range top.Consumers() {
			members = append(members, consumeMember(ev, cs.Subscription()))
		}
		for _, m := range members {
			for _, r := range roles {
				if !have[m+" "+r] {
					t.Errorf("%s lacks %s: its telemetry exports are refused", m, r)
				}
			}
		}
	})

	c := loadTerraform(t, terraformDir(t))
	vars := requiredVars(t)
	vars["telemetry"] = cty.ObjectVal(map[string]cty.Value{"export": cty.StringVal("off")})
	ev := c.newEvaluator(t, vars).withStubs()
	var left []string
	for _, g := range grantsOf(t, c, ev, "google_project_iam_member", "project") {
		for _, r := range roles {
			if g.role == r {
				left = append(left, g.resource)
			}
		}
	}
	sort.Strings(left)
	if len(left) > 0 {
		t.Errorf("telemetry export off still grants %v", left)
	}
}

// TestFirestoreIndexesAreReplacedNewFirst: an index is keyed by the query
// it serves (its fields but shard), so adding shard to one keeps its key
// and Terraform replaces it, creating the new index before it destroys the
// old (create_before_destroy): keyed by every field, the aggregate index
// was destroyed and another created at once, and the console's aggregate
// search failed while Firestore built it. The old keys move to the new ones.
func TestFirestoreIndexesAreReplacedNewFirst(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	ev := c.newEvaluator(t, requiredVars(t))
	indexes := jsonValue(t, ev.local("composite_indexes")).(map[string]any)
	sharded := 0
	for key, ix := range indexes {
		fields := ix.(map[string]any)["fields"].([]any)
		var all, shape []string
		for _, f := range fields {
			m := f.(map[string]any)
			all = append(all, m["field"].(string)+":"+m["order"].(string))
			if m["field"] != "shard" {
				shape = append(shape, m["field"].(string)+":"+m["order"].(string))
			}
		}
		col := ix.(map[string]any)["collection"].(string)
		if want := col + ":" + strings.Join(shape, ","); key != want {
			t.Errorf("index %s is keyed %q: adding or removing shard would change its key", want, key)
		}
		if len(shape) != len(all) {
			sharded++
			from := `google_firestore_index.ledger["` + col + ":" + strings.Join(all, ",") + `"]`
			if !strings.Contains(string(c.src["firestore.tf"]), "from = "+from) {
				t.Errorf("no moved block from %s", from)
			}
		}
	}
	if sharded == 0 || len(indexes) < 10 {
		t.Fatalf("%d indexes, %d sharded: the test cannot see them", len(indexes), sharded)
	}
	lc := block(t, "google_firestore_index.ledger", c.resource(t, "google_firestore_index.ledger").Body, "lifecycle")
	if v, diags := lc.Attributes["create_before_destroy"].Expr.Value(nil); diags.HasErrors() || !v.True() {
		t.Error("google_firestore_index.ledger is not create_before_destroy")
	}
}

// TestAPublisherIsGrantedOnce: a principal in both var.publish_invokers
// and a topic's publishers (the topology's or var.publishers) got two
// google_cloud_run_v2_service_iam_member resources for one binding, which
// compete (removing either drops the member for both). It is granted once.
func TestAPublisherIsGrantedOnce(t *testing.T) {
	doc := "rollup: {topic: relaybus.ledger.rollup}\ntopics:\n  - name: shop.order.events\n    publishers: [orders@p.iam.gserviceaccount.com, bob@example.com]\n    consumers: [{service: billing}]\n"
	path, _ := topologyFile(t, doc)
	c := loadTerraform(t, terraformDir(t))
	vars := requiredVars(t)
	vars["topology_file"] = cty.StringVal(path)
	vars["publish_invokers"] = cty.ListVal([]cty.Value{cty.StringVal("serviceAccount:orders@p.iam.gserviceaccount.com"), cty.StringVal("user:carol@example.com")})
	// var.publishers names the same principals again, and one of its own.
	vars["publishers"] = cty.MapVal(map[string]cty.Value{"shop.order.events": cty.ListVal([]cty.Value{
		cty.StringVal("orders@p.iam.gserviceaccount.com"), cty.StringVal("bob@example.com"), cty.StringVal("carol@example.com"), cty.StringVal("dave@example.com")})})
	ev := c.newEvaluator(t, vars).withStubs()
	seen := map[string][]string{}
	for _, g := range grantsOf(t, c, ev, "google_cloud_run_v2_service_iam_member", "name") {
		if g.target == "relaybus-publish" {
			seen[g.member] = append(seen[g.member], g.resource)
		}
	}
	for _, m := range []string{"serviceAccount:orders@p.iam.gserviceaccount.com", "user:bob@example.com", "user:carol@example.com", "user:dave@example.com"} {
		if len(seen[m]) != 1 {
			t.Errorf("%s may invoke publish through %d resources %v, want 1", m, len(seen[m]), seen[m])
		}
	}
}

// TestConnectionArithmeticIsCurrent: the connection figures database.tf's
// comment and infra/terraform/README.md print are what the locals compute
// for the defaults and the repository's topology (the comment said 65 and
// 340 after dlqreplay came to read every database: 75 and 350), and the
// URL closes idle connections within a minute, so a revision that no
// longer gets traffic gives its pools back.
func TestConnectionArithmeticIsCurrent(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	path, _ := repoTopology(t)
	vars := requiredVars(t)
	vars["topology_file"] = cty.StringVal(path)
	ev := c.newEvaluator(t, vars).withStubs()
	conns := jsonValue(t, ev.local("database_connections")).(map[string]any)
	total := jsonValue(t, ev.local("cloudsql_connections"))
	tf := string(c.src["database.tf"])
	for db, n := range conns {
		if !regexp.MustCompile(`(?m)^#\s+` + db + `\s+5 × \([^)]*\)\s+=\s+` + fmt.Sprint(n) + `$`).MatchString(tf) {
			t.Errorf("database.tf's comment does not say %s = %v", db, n)
		}
	}
	if !strings.Contains(tf, fmt.Sprintf("#   total %v ≤ 400 − 20 = 380", total)) {
		t.Errorf("database.tf's comment does not say total %v", total)
	}
	readme, err := os.ReadFile(filepath.Join(terraformDir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(string(readme)), " ")
	for db, n := range conns {
		if !regexp.MustCompile(db + " `5 × \\([^)]*\\) = " + fmt.Sprint(n) + "`").MatchString(flat) {
			t.Errorf("infra/terraform/README.md does not say %s = %v", db, n)
		}
	}
	if !strings.Contains(flat, fmt.Sprintf("total %v ≤", total)) {
		t.Errorf("infra/terraform/README.md does not say total %v", total)
	}
	// The services connect as their roles (database_role_urls); an old
	// revision's pools must give their connections back.
	roles := ev.local("database_role_urls")
	if roles.LengthInt() == 0 {
		t.Fatal("no runtime role URLs")
	}
	for it := roles.ElementIterator(); it.Next(); {
		k, u := it.Element()
		cfg, err := pgxpool.ParseConfig(u.AsString())
		if err != nil {
			t.Fatal(err)
		}
		if cfg.MaxConnIdleTime <= 0 || cfg.MaxConnIdleTime > time.Minute {
			t.Errorf("%s: pool_max_conn_idle_time %v: an old revision's idle pools stay open", k.AsString(), cfg.MaxConnIdleTime)
		}
	}
}

// shellWords is how sh splits a command into words: the words are printed
// by the shell itself (set --), nothing is run.
func shellWords(t *testing.T, command string) []string {
	t.Helper()
	out, err := exec.Command("sh", "-c", "set -- "+command+"; for a in \"$@\"; do printf '%s\\0' \"$a\"; done").Output()
	if err != nil {
		t.Fatalf("sh cannot split %s: %v", command, err)
	}
	words := strings.Split(string(out), "\x00")
	return words[:len(words)-1]
}

// TestDeployShellCommandsQuoteTheirArguments: the commands Terraform runs
// in a shell as the deploy account (the schema sync, the Eventarc
// subscription policies, the topic_consumers sync) pass every argument as
// one word, whatever it holds: a topology path with a space, a quote or
// a $(...) stays one literal argument. The schema step used to put schema
// file paths into the shell unquoted. The schema sync is relaybus schemas
// sync over the topic, so each schema keeps one revision per declared
// version (Pub/Sub caps a schema at 20 revisions; re-committing every
// version on each change, and never deleting one, hit the cap).
func TestDeployShellCommandsQuoteTheirArguments(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "it's a $(touch pwned) dir")
	if err := os.MkdirAll(filepath.Join(dir, "schemas"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"topology.yaml":      "rollup: {topic: relaybus.ledger.rollup}\ntopics:\n  - name: shop.order.events\n    schemas:\n      - {version: v1, type: protobuf, file: schemas/o v1.proto, message: shop.v1.Order}\n    consumers: [{service: billing, delivery: eventarc}]\n",
		"schemas/o v1.proto": `syntax = "proto3"; package shop.v1; message Order { string id = 1; }`,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c := loadTerraform(t, terraformDir(t))
	vars := requiredVars(t)
	vars["topology_file"] = cty.StringVal(filepath.Join(dir, "topology.yaml"))
	vars["relaybus"] = cty.StringVal("/opt/relay bus/relaybus")
	ev := c.newEvaluator(t, vars).withStubs()
	command := func(key, instance string, value cty.Value) []string {
		b := c.resource(t, key)
		var prov *hclsyntax.Body
		for _, p := range b.Body.Blocks {
			if p.Type == "provisioner" {
				prov = p.Body
			}
		}
		in := newInstance(t, ev, ev.stubs, key, instance, value)
		in.extra["google_cloud_run_v2_job"] = cty.ObjectVal(map[string]cty.Value{"sync_consumers": cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal("relaybus-sync-consumers")})})
		return shellWords(t, in.attr(prov, "command").AsString())
	}
	topics := forEachKeys(t, ev, c.resource(t, "terraform_data.schema_revisions"))
	got := command("terraform_data.schema_revisions", "shop.order.events", topics["shop.order.events"])
	want := []string{"/opt/relay bus/relaybus", "schemas", "sync", "--project=relaybus-test", "--topology=" + filepath.Join(dir, "topology.yaml"), "--topic=shop.order.events"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("schema sync runs %q, want %q", got, want)
	}
	for k, v := range forEachKeys(t, ev, c.resource(t, "terraform_data.eventarc_subscription_policy")) {
		if words := command("terraform_data.eventarc_subscription_policy", k, v); len(words) != 14 || words[0] != "gcloud" {
			t.Errorf("Eventarc policy of %s splits into %d words: %q", k, len(words), words)
		}
	}
	if words := command("terraform_data.sync_consumers", "", cty.NilVal); len(words) != 8 || words[4] != "relaybus-sync-consumers" {
		t.Errorf("topic_consumers sync splits into %q", words)
	}
	if _, err := os.Stat(filepath.Join(dir, "pwned")); err == nil {
		t.Error("a path ran a command")
	}
}

// TestPullSwitchKeepsTheBacklog: switching a consumer to pull mode
// replaces its subscription with a new, empty one (an Eventarc trigger's
// subscription cannot become a pull one in place, and Terraform leaves a
// push subscription's push_config to the operators). The chosen route is
// a documented switch: docs/deploying.md snapshots the old subscription
// (by the id Pub/Sub has, the subscriptions output) before the apply and
// seeks the new one to that snapshot after it. Nothing said so before.
func TestPullSwitchKeepsTheBacklog(t *testing.T) {
	cmds := shellCommands(docSection(t, "docs/deploying.md", "## Pull mode"))
	snap, seek := -1, -1
	for i, c := range cmds {
		if strings.HasPrefix(c, "gcloud pubsub snapshots create relaybus-pull-switch --subscription=") && strings.Contains(c, "output -json subscriptions") {
			snap = i
		}
		if c == "gcloud pubsub subscriptions seek $SUB --snapshot=relaybus-pull-switch" {
			seek = i
		}
	}
	if snap < 0 || seek < snap {
		t.Errorf("the pull mode switch does not snapshot the old subscription and then seek the new one: %q", cmds)
	}
	raw, err := os.ReadFile(filepath.Join(terraformDir(t), "pull.tf"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `docs/deploying.md ("Pull mode")`) {
		t.Error("pull.tf does not point at the switch")
	}
}
