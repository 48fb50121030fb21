package infra

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/relaybus/relaybus/shared/topology"
)

// recordedMetrics are the metric names internal/telemetry records: the values
// of its Metric* constants, read from its source.
func recordedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "internal", "telemetry")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	out := map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !strings.HasPrefix(n.Name, "Metric") || i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, _ := strconv.Unquote(lit.Value)
						out[v] = true
					}
				}
			}
		}
	}
	if len(out) < 8 {
		t.Fatalf("found %d Metric* constants in internal/telemetry; the test cannot read them", len(out))
	}
	return out
}

// promqlMetrics returns the metric names a PromQL query selects (quoted
// UTF-8 names, {"name", ...}), a histogram's _bucket/_count/_sum suffix
// removed.
func promqlMetrics(q string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`\{\\?"([a-zA-Z][a-zA-Z0-9_.:/]*)\\?"`).FindAllStringSubmatch(q, -1) {
		name := m[1]
		for _, suf := range []string{"_bucket", "_count", "_sum"} {
			name = strings.TrimSuffix(name, suf)
		}
		out = append(out, name)
	}
	return out
}

// TestDashboardAndAlertReadMetricsTheCodeRecords: every metric the
// dashboard's charts and the end-to-end alert query is one internal/telemetry
// records, and every chart's query exists; the alert's threshold is the
// variable's.
func TestDashboardAndAlertReadMetricsTheCodeRecords(t *testing.T) {
	recorded := recordedMetrics(t)
	c := loadTerraform(t, terraformDir(t))
	promql := c.locals["telemetry_promql"]
	if promql == nil {
		t.Fatal("local.telemetry_promql is missing")
	}
	queries := map[string]string{}
	for _, item := range promql.Expr.(*hclsyntax.ObjectConsExpr).Items {
		k := c.exprSource(item.KeyExpr)
		queries[strings.Trim(k, `"`)] = c.exprSource(item.ValueExpr)
	}
	read := map[string]bool{}
	for name, q := range queries {
		ms := promqlMetrics(q)
		if len(ms) == 0 {
			t.Errorf("query %s selects no metric: %s", name, q)
		}
		for _, m := range ms {
			read[m] = true
			if !recorded[m] {
				t.Errorf("query %s reads %q, which internal/telemetry does not record", name, m)
			}
		}
	}
	for _, want := range []string{"messaging.client.operation.duration", "messaging.client.sent.messages",
		"messaging.client.consumed.messages", "messaging.process.duration", "relaybus.hop.duration", "relaybus.outbox.oldest_pending.age",
		"relaybus.projection.version_lag", "relaybus.projection.stale"} {
		if !read[want] {
			t.Errorf("the dashboard does not chart %s", want)
		}
	}
	charts := c.exprSource(c.locals["telemetry_charts"].Expr)
	for _, m := range regexp.MustCompile(`queries\s*=\s*\[([^\]]*)\]`).FindAllStringSubmatch(charts, -1) {
		for _, q := range strings.Split(m[1], ",") {
			if q = strings.Trim(strings.TrimSpace(q), `"`); queries[q] == "" {
				t.Errorf("a chart uses query %q, which local.telemetry_promql lacks", q)
			}
		}
	}
	alert := c.resource(t, "google_monitoring_alert_policy.end_to_end_latency")
	cond := block(t, "end_to_end_latency", block(t, "end_to_end_latency", alert.Body, "conditions"), "condition_prometheus_query_language")
	src := c.exprSource(cond.Attributes["query"].Expr)
	if !strings.Contains(src, "local.telemetry_promql.end_to_end_p99") || !strings.Contains(src, "var.telemetry.end_to_end_p99_seconds") {
		t.Errorf("the alert's query is not the end-to-end p99 against the variable: %s", src)
	}
	if !strings.Contains(queries["end_to_end_p99"], `\"relaybus.hop\"=\"end_to_end\"`) {
		t.Errorf("end_to_end_p99 does not select the end_to_end hop: %s", queries["end_to_end_p99"])
	}
}

// TestDocsListEveryMetric: docs/telemetry.md's metric table has a row for
// every metric internal/telemetry records, so none ships unexplained.
func TestDocsListEveryMetric(t *testing.T) {
	doc := read(t, "docs/telemetry.md")
	for m := range recordedMetrics(t) {
		if !strings.Contains(doc, "| `"+m+"` |") {
			t.Errorf("docs/telemetry.md's metric table has no row for %s", m)
		}
	}
}

// TestDashboardConvergesInPlan: the dashboard JSON carries no field the
// Monitoring API leaves out of what it returns, a zero tile position above
// all: with xPos = 0 or yPos = 0 written, every plan showed an update to
// the dashboard (hashicorp/terraform-provider-google#16173). Tiles do not
// overlap and stay within the 12 columns.
func TestDashboardConvergesInPlan(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	ev := c.newEvaluator(t, requiredVars(t)).withStubs()
	for _, key := range c.resourcesOfType("google_monitoring_dashboard") {
		v, diags := ev.eval(c.resource(t, key).Body.Attributes["dashboard_json"].Expr, nil)
		if diags.HasErrors() {
			t.Fatalf("%s: %s", key, diags.Error())
		}
		var dash struct {
			MosaicLayout struct {
				Columns int              `json:"columns"`
				Tiles   []map[string]any `json:"tiles"`
			} `json:"mosaicLayout"`
		}
		if err := jsonUnmarshal([]byte(v.AsString()), &dash); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if len(dash.MosaicLayout.Tiles) < 2 {
			t.Fatalf("%s: %d tiles", key, len(dash.MosaicLayout.Tiles))
		}
		type cell struct{ x, y int }
		used := map[cell]int{}
		for i, tile := range dash.MosaicLayout.Tiles {
			pos := map[string]int{}
			for _, f := range []string{"xPos", "yPos", "width", "height"} {
				raw, ok := tile[f]
				if !ok {
					continue
				}
				n, _ := strconv.Atoi(fmt.Sprint(raw))
				if n == 0 {
					t.Errorf("%s: tile %d writes %s = 0, which the API drops: the plan never converges", key, i, f)
				}
				pos[f] = n
			}
			if pos["width"] == 0 || pos["height"] == 0 || pos["xPos"]+pos["width"] > dash.MosaicLayout.Columns {
				t.Errorf("%s: tile %d at %v does not fit %d columns", key, i, pos, dash.MosaicLayout.Columns)
			}
			for x := pos["xPos"]; x < pos["xPos"]+pos["width"]; x++ {
				for y := pos["yPos"]; y < pos["yPos"]+pos["height"]; y++ {
					if j, taken := used[cell{x, y}]; taken {
						t.Errorf("%s: tiles %d and %d overlap at %d,%d", key, j, i, x, y)
					}
					used[cell{x, y}] = i
				}
			}
		}
	}
}

// TestDeliveryDashboardShowsEverySubscription: a second dashboard charts
// what Pub/Sub says of every consumer subscription: undelivered messages and the oldest unacked message's age
// per consumer, push responses by class, dead-lettered messages, and the
// dead-letter monitors' backlog; each tile filters on every consumer's
// real subscription id (the trigger's for an Eventarc consumer).
func TestDeliveryDashboardShowsEverySubscription(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		v, diags := ev.eval(c.resource(t, "google_monitoring_dashboard.delivery").Body.Attributes["dashboard_json"].Expr, nil)
		if diags.HasErrors() {
			t.Fatal(diags.Error())
		}
		var dash struct {
			MosaicLayout struct {
				Tiles []struct {
					Widget struct {
						Title   string
						XyChart struct {
							DataSets []struct {
								TimeSeriesQuery struct {
									TimeSeriesFilter struct {
										Filter      string
										Aggregation struct{ PerSeriesAligner string }
									}
								}
							}
						}
					}
				}
			}
		}
		if err := jsonUnmarshal([]byte(v.AsString()), &dash); err != nil {
			t.Fatal(err)
		}
		ids := jsonValue(t, ev.local("consumer_subscription_ids")).(map[string]any)
		seen := map[string]bool{}
		for _, tile := range dash.MosaicLayout.Tiles {
			for _, ds := range tile.Widget.XyChart.DataSets {
				f := ds.TimeSeriesQuery.TimeSeriesFilter.Filter
				m := regexp.MustCompile(`metric\.type = "([^"]+)"`).FindStringSubmatch(f)
				if m == nil {
					t.Fatalf("tile %q: no metric in %s", tile.Widget.Title, f)
				}
				seen[m[1]] = true
				if strings.Contains(f, ".dlq-monitor") {
					continue
				}
				for _, real := range ids {
					if !strings.Contains(f, `"`+real.(string)+`"`) {
						t.Errorf("tile %q does not cover %s", tile.Widget.Title, real)
					}
				}
			}
		}
		for _, m := range []string{"pubsub.googleapis.com/subscription/num_undelivered_messages", "pubsub.googleapis.com/subscription/oldest_unacked_message_age",
			"pubsub.googleapis.com/subscription/push_request_count", "pubsub.googleapis.com/subscription/dead_letter_message_count"} {
			if !seen[m] {
				t.Errorf("the delivery dashboard does not chart %s", m)
			}
		}
	})
}
