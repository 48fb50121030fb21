package dashview

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// The dashboard Terraform deploys, read as Terraform evaluates it: every
// chart of local.telemetry_charts is a tile of the mosaic, in two columns,
// and every data set's query parses.
func TestFromTerraformReadsTheDeployedDashboard(t *testing.T) {
	d, err := FromTerraform(filepath.Join("..", "..", "infra", "terraform", "telemetry.tf"), "relaybus")
	if err != nil {
		t.Fatal(err)
	}
	if d.DisplayName != "relaybus" || d.MosaicLayout.Columns != 12 || len(d.MosaicLayout.Tiles) < 14 {
		t.Fatalf("dashboard %q, %d columns, %d tiles", d.DisplayName, d.MosaicLayout.Columns, len(d.MosaicLayout.Tiles))
	}
	titles := ""
	for i, tile := range d.MosaicLayout.Tiles {
		if tile.XPos != (i%2)*6 || tile.YPos != (i/2)*4 || tile.Width != 6 || tile.Height != 4 {
			t.Errorf("tile %d %q at %d,%d %dx%d", i, tile.Widget.Title, tile.XPos, tile.YPos, tile.Width, tile.Height)
		}
		for _, ds := range tile.Widget.XyChart.DataSets {
			if _, err := Parse(ds.TimeSeriesQuery.PrometheusQuery); err != nil {
				t.Errorf("%s: %v", tile.Widget.Title, err)
			}
		}
		titles += tile.Widget.Title + "\n"
	}
	if !strings.Contains(titles, "Projection version lag") {
		t.Errorf("no projection version lag tile among:\n%s", titles)
	}
	if _, err := FromTerraform(filepath.Join("..", "..", "infra", "terraform", "telemetry.tf"), "nope"); err == nil {
		t.Error("a dashboard that does not exist was read")
	}
}

func TestParseRefusesWhatItCannotEvaluate(t *testing.T) {
	for _, q := range []string{
		`rate({"a"})`,
		`topk(3, {"a"})`,
		`sum by (x) {"a"}`,
		`{"a", "b"=~"("}`,
		`{"a"`,
		`histogram_quantile(x, {"a"})`,
		`{"a"} {"b"}`,
	} {
		if _, err := Parse(q); err == nil {
			t.Errorf("%s parsed", q)
		}
	}
}

// A recording of two collections ten seconds apart: a counter per topic,
// a histogram with bounds 1, 2, 5, a gauge.
func recording() *Recording {
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	topic := func(s string) attribute.Set { return attribute.NewSet(attribute.String("topic", s)) }
	snap := func(a, b int64, counts []uint64, sum float64, gauge float64) metricdata.ResourceMetrics {
		var n uint64
		for _, c := range counts {
			n += c
		}
		sent := []metricdata.DataPoint[int64]{{Attributes: topic("a"), Value: a}}
		if b > 0 {
			sent = append(sent, metricdata.DataPoint[int64]{Attributes: topic("b"), Value: b})
		}
		return metricdata.ResourceMetrics{ScopeMetrics: []metricdata.ScopeMetrics{{Metrics: []metricdata.Metrics{
			{Name: "sent", Data: metricdata.Sum[int64]{IsMonotonic: true, DataPoints: sent}},
			{Name: "lat", Data: metricdata.Histogram[float64]{DataPoints: []metricdata.HistogramDataPoint[float64]{
				{Attributes: topic("a"), Bounds: []float64{1, 2, 5}, BucketCounts: counts, Count: n, Sum: sum}}}},
			{Name: "age", Data: metricdata.Gauge[float64]{DataPoints: []metricdata.DataPoint[float64]{{Attributes: topic("a"), Value: gauge}}}},
		}}}}
	}
	r := &Recording{}
	r.Add(at, snap(10, 0, []uint64{1, 2, 1, 0}, 7.5, 3))
	r.Add(at.Add(10*time.Second), snap(30, 5, []uint64{1, 6, 1, 0}, 13.5, 8))
	return r
}

func TestEvalOverARecording(t *testing.T) {
	r := recording()
	for _, c := range []struct{ q, want string }{
		// rate: (30-10)/10 s; b was not recorded at the first collection:
		// 0 then (a counter starts at 0 with the run).
		{`sum by ("topic") (rate({"sent"}[5m]))`, `[topic=a: NaN 2] [topic=b: NaN 0.5]`},
		{`sum by () (increase({"sent", "topic"=~"a|c"}[1h]))`, `[: NaN 20]`},
		{`sum by ("topic") (rate({"sent", "topic"!="a"}[5m])) / sum by ("topic") (rate({"sent"}[5m]))`, `[topic=b: NaN 1]`},
		// A range shorter than the collections apart holds one sample: no rate.
		{`sum by ("topic") (rate({"sent"}[5s]))`, ``},
		// Over the run: 4 observations, all in (1, 2]: the median is at 2 of
		// 4 in that bucket, 1 + (2-1)*2/4.
		{`histogram_quantile(0.5, sum by (le) (rate({"lat_bucket"}[5m])))`, `[: NaN 1.5]`},
		// At each instant, over everything so far (cumulative buckets): 4
		// then 8 observations; p99 falls in (2, 5]: 2 + 3*(3.96-3)/1, then
		// 2 + 3*(7.92-7)/1.
		{`histogram_quantile(0.99, sum by (le, "topic") ({"lat_bucket"}))`, `[topic=a: 4.88 4.76]`},
		{`max by ("topic") ({"age"})`, `[topic=a: 3 8]`},
		{`sum by ("topic") (rate({"lat_count"}[1m])) / sum by ("topic") (rate({"lat_count"}[1m]))`, `[topic=a: NaN 1]`},
	} {
		q, err := Parse(c.q)
		if err != nil {
			t.Fatalf("%s: %v", c.q, err)
		}
		got := ""
		for _, s := range q.Eval(r) {
			l := ""
			for k, v := range s.Labels {
				l += k + "=" + v
			}
			vs := make([]string, len(s.Values))
			for i, v := range s.Values {
				vs[i] = fmt.Sprintf("%.3g", v)
				if math.IsNaN(v) {
					vs[i] = "NaN"
				}
			}
			got += strings.TrimSpace(fmt.Sprintf(" [%s: %s]", l, strings.Join(vs, " ")))
			got += " "
		}
		if got = strings.TrimSpace(got); got != c.want {
			t.Errorf("%s\n got %s\nwant %s", c.q, got, c.want)
		}
	}
}

// Every chart of a dashboard is drawn in its place, with its lines and
// legends (here one point each: a rate needs two collections); a chart
// without data says so, as Cloud Monitoring does.
func TestHTMLDrawsEveryTile(t *testing.T) {
	var d Dashboard
	d.DisplayName, d.MosaicLayout.Columns = "relaybus", 12
	for i, q := range []string{`sum by ("topic") (rate({"sent"}[5m]))`, `max by ("topic") ({"missing"})`} {
		tile := Tile{XPos: i * 6, Width: 6, Height: 4}
		tile.Widget.Title = fmt.Sprintf("chart %d", i)
		ds := DataSet{LegendTemplate: "sent"}
		ds.TimeSeriesQuery.PrometheusQuery = q
		tile.Widget.XyChart.DataSets = []DataSet{ds}
		d.MosaicLayout.Tiles = append(d.MosaicLayout.Tiles, tile)
	}
	r := recording()
	charts := Evaluate(d, r)
	if charts[0].Points() != 2 || charts[1].Points() != 0 {
		t.Fatalf("points %d and %d, want 2 and 0", charts[0].Points(), charts[1].Points())
	}
	b, err := HTML(d, r, charts, "a run")
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{"chart 0", "chart 1", "grid-column:1 / span 6", "grid-column:7 / span 6", "sent a", "sent b", "<circle", "No data is available"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}
