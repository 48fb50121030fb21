// Package dashview draws relaybus's Cloud Monitoring dashboard as a person
// sees it, from the dashboard JSON Terraform deploys
// (infra/terraform/telemetry.tf, google_monitoring_dashboard.relaybus) and
// metrics an OpenTelemetry manual reader collected over a run: each tile
// at its place in the mosaic layout, each data set's PromQL query
// evaluated over the run as Cloud Monitoring would evaluate it over the
// exported series, drawn as lines.
//
// It evaluates the subset of PromQL the dashboard uses (see Parse), over
// the series the Telemetry API would write: a counter or gauge as its
// name, a histogram as name_bucket{le}, name_count and name_sum, the
// attributes as labels
// (https://cloud.google.com/stackdriver/docs/reference/telemetry/v1.metrics).
package dashview

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
)

// Dashboard is the part of a Cloud Monitoring dashboard
// (https://cloud.google.com/monitoring/api/ref_v3/rest/v1/projects.dashboards)
// that relaybus's uses: a mosaic of xyChart tiles of PromQL data sets.
type Dashboard struct {
	DisplayName  string `json:"displayName"`
	MosaicLayout struct {
		Columns int    `json:"columns"`
		Tiles   []Tile `json:"tiles"`
	} `json:"mosaicLayout"`
}

// Tile is one chart and its place in the mosaic (in columns and rows).
type Tile struct {
	XPos   int `json:"xPos"`
	YPos   int `json:"yPos"`
	Width  int `json:"width"`
	Height int `json:"height"`
	Widget struct {
		Title   string `json:"title"`
		XyChart struct {
			DataSets []DataSet `json:"dataSets"`
		} `json:"xyChart"`
	} `json:"widget"`
}

// DataSet is one query of a chart.
type DataSet struct {
	PlotType        string `json:"plotType"`
	LegendTemplate  string `json:"legendTemplate"`
	TimeSeriesQuery struct {
		PrometheusQuery string `json:"prometheusQuery"`
	} `json:"timeSeriesQuery"`
}

// FromTerraform reads the dashboard_json of the google_monitoring_dashboard
// resource named name in the Terraform file path, evaluating it as
// Terraform would: with the file's locals and Terraform's jsonencode,
// floor and merge. A local that needs anything else (a variable, a resource) is left
// out; the dashboard must not need one.
func FromTerraform(path, name string) (Dashboard, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return Dashboard{}, fmt.Errorf("dashview: %w", err)
	}
	f, diags := hclsyntax.ParseConfig(src, path, hcl.InitialPos)
	if diags.HasErrors() {
		return Dashboard{}, fmt.Errorf("dashview: %s", diags.Error())
	}
	body := f.Body.(*hclsyntax.Body)
	ctx := &hcl.EvalContext{
		Variables: map[string]cty.Value{},
		Functions: map[string]function.Function{"jsonencode": stdlib.JSONEncodeFunc, "floor": stdlib.FloorFunc, "merge": stdlib.MergeFunc},
	}
	locals := map[string]cty.Value{}
	var pending []*hclsyntax.Attribute
	for _, b := range body.Blocks {
		if b.Type == "locals" {
			for _, a := range b.Body.Attributes {
				pending = append(pending, a)
			}
		}
	}
	// Locals may refer to one another: evaluate until nothing more can be.
	for progress := true; progress; {
		progress = false
		ctx.Variables["local"] = cty.ObjectVal(locals)
		rest := pending[:0]
		for _, a := range pending {
			v, d := a.Expr.Value(ctx)
			if d.HasErrors() {
				rest = append(rest, a)
				continue
			}
			locals[a.Name], progress = v, true
		}
		pending = rest
	}
	ctx.Variables["local"] = cty.ObjectVal(locals)
	for _, b := range body.Blocks {
		if b.Type != "resource" || len(b.Labels) != 2 || b.Labels[0] != "google_monitoring_dashboard" || b.Labels[1] != name {
			continue
		}
		a := b.Body.Attributes["dashboard_json"]
		if a == nil {
			return Dashboard{}, fmt.Errorf("dashview: %s: google_monitoring_dashboard.%s has no dashboard_json", path, name)
		}
		v, d := a.Expr.Value(ctx)
		if d.HasErrors() {
			return Dashboard{}, fmt.Errorf("dashview: google_monitoring_dashboard.%s.dashboard_json: %s", name, d.Error())
		}
		if v.Type() != cty.String {
			return Dashboard{}, fmt.Errorf("dashview: google_monitoring_dashboard.%s.dashboard_json is a %s, not a string", name, v.Type().FriendlyName())
		}
		var dash Dashboard
		if err := json.Unmarshal([]byte(v.AsString()), &dash); err != nil {
			return Dashboard{}, fmt.Errorf("dashview: google_monitoring_dashboard.%s.dashboard_json: %w", name, err)
		}
		return dash, nil
	}
	return Dashboard{}, fmt.Errorf("dashview: %s has no google_monitoring_dashboard.%s", path, name)
}
