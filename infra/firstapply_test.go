package infra

import (
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hclsyntax"
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
