package dashview

import (
	"bytes"
	"fmt"
	"html/template"
	"math"
	"sort"
	"strings"
	"time"
)

// Chart is one tile evaluated over a recording.
type Chart struct {
	Tile   Tile
	Title  string
	Series []Line
	Err    error
}

// Line is one drawn series: its legend and values.
type Line struct {
	Legend string
	Values []float64
}

// Points counts the values the chart draws.
func (c Chart) Points() int {
	n := 0
	for _, l := range c.Series {
		for _, v := range l.Values {
			if !math.IsNaN(v) {
				n++
			}
		}
	}
	return n
}

// Evaluate evaluates every tile's queries over r; a query that does not
// parse is the chart's Err.
func Evaluate(d Dashboard, r *Recording) []Chart {
	out := make([]Chart, 0, len(d.MosaicLayout.Tiles))
	for _, t := range d.MosaicLayout.Tiles {
		c := Chart{Tile: t, Title: t.Widget.Title}
		for _, ds := range t.Widget.XyChart.DataSets {
			q, err := Parse(ds.TimeSeriesQuery.PrometheusQuery)
			if err != nil {
				c.Err = err
				break
			}
			for _, s := range q.Eval(r) {
				c.Series = append(c.Series, Line{Legend: legend(ds.LegendTemplate, s.Labels), Values: s.Values})
			}
		}
		out = append(out, c)
	}
	return out
}

// legend is the data set's legend followed by the series' label values.
func legend(template string, labels map[string]string) string {
	ks := make([]string, 0, len(labels))
	for k := range labels {
		if k != "__name__" {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	var vs []string
	for _, k := range ks {
		vs = append(vs, labels[k])
	}
	if len(vs) == 0 {
		return template
	}
	return template + " " + strings.Join(vs, " / ")
}

var colours = []string{"#1a73e8", "#e8710a", "#188038", "#a142f4", "#d01884", "#12b5cb", "#f9ab00", "#5f6368", "#b31412", "#0d652d"}

// HTML draws the charts as the dashboard's mosaic, with times at the
// recording's snapshots (seconds since the first).
func HTML(d Dashboard, r *Recording, charts []Chart, subtitle string) ([]byte, error) {
	times := r.Times()
	type tile struct {
		Style  template.CSS
		Title  string
		SVG    template.HTML
		Legend []legendItem
		Err    string
	}
	cols := d.MosaicLayout.Columns
	if cols <= 0 {
		cols = 12
	}
	var tiles []tile
	for _, c := range charts {
		t := tile{Title: c.Title, Style: template.CSS(fmt.Sprintf("grid-column:%d / span %d;grid-row:%d / span %d",
			c.Tile.XPos+1, c.Tile.Width, c.Tile.YPos+1, c.Tile.Height))}
		if c.Err != nil {
			t.Err = c.Err.Error()
		}
		svg, items := chartSVG(c, times)
		t.SVG, t.Legend = svg, items
		tiles = append(tiles, t)
	}
	var b bytes.Buffer
	err := dashPage.Execute(&b, map[string]any{"Name": d.DisplayName, "Sub": subtitle, "Cols": cols, "Tiles": tiles})
	return b.Bytes(), err
}

type legendItem struct {
	Colour template.CSS
	Text   string
}

const (
	svgW, svgH             = 560.0, 170.0
	padL, padR, padT, padB = 48.0, 8.0, 8.0, 22.0
)

// chartSVG draws a chart's lines on axes: y from 0 to a round maximum,
// x over the recording's seconds.
func chartSVG(c Chart, times []time.Time) (template.HTML, []legendItem) {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg viewBox="0 0 %.0f %.0f" preserveAspectRatio="none">`, svgW, svgH)
	hi := 0.0
	for _, l := range c.Series {
		for _, v := range l.Values {
			if !math.IsNaN(v) {
				hi = math.Max(hi, v)
			}
		}
	}
	top := niceMax(hi)
	span := 1.0
	if len(times) > 1 {
		span = times[len(times)-1].Sub(times[0]).Seconds()
	}
	x := func(i int) float64 {
		if len(times) < 2 {
			return padL
		}
		return padL + (svgW-padL-padR)*times[i].Sub(times[0]).Seconds()/span
	}
	y := func(v float64) float64 { return svgH - padB - (svgH-padT-padB)*v/top }
	for k := 0; k <= 4; k++ {
		v := top * float64(k) / 4
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#e8eaed"/>`, padL, svgW-padR, y(v), y(v))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" class="ax">%s</text>`, padL-4, y(v)+3, short(v))
	}
	for _, s := range []float64{0, 0.25, 0.5, 0.75, 1} {
		sec := span * s
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" class="ax">%.0fs</text>`, padL+(svgW-padL-padR)*s, svgH-6, sec)
	}
	var items []legendItem
	for i, l := range c.Series {
		col := colours[i%len(colours)]
		items = append(items, legendItem{template.CSS(col), l.Legend})
		var pts []string
		flush := func() {
			if len(pts) == 1 {
				fmt.Fprintf(&b, `<circle r="2" cx="%s" fill="%s"/>`, strings.Replace(pts[0], ",", `" cy="`, 1), col)
			} else if len(pts) > 1 {
				fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.6" points="%s"/>`, col, strings.Join(pts, " "))
			}
			pts = pts[:0]
		}
		for j, v := range l.Values {
			if math.IsNaN(v) {
				flush()
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(j), y(v)))
		}
		flush()
	}
	if len(c.Series) == 0 {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" class="none">No data is available for the selected time frame.</text>`, svgW/2, svgH/2)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()), items //nolint:gosec // built here from numbers and fixed markup
}

// niceMax rounds v up to 1, 2 or 5 times a power of ten (1 when v is 0).
func niceMax(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func short(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 1000:
		return fmt.Sprintf("%.3gk", v/1000)
	}
	return fmt.Sprintf("%.3g", v)
}

var dashPage = template.Must(template.New("dashboard").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>{{.Name}}</title>
<style>
body { font: 13px/1.35 Roboto, "Noto Sans", "DejaVu Sans", Arial, sans-serif; color: #202124; margin: 0; background: #f1f3f4; }
header { background: #fff; border-bottom: 1px solid #dadce0; padding: 14px 24px; }
h1 { font-size: 20px; font-weight: 400; margin: 0 0 2px; }
.sub { color: #5f6368; }
.grid { display: grid; grid-template-columns: repeat({{.Cols}}, 1fr); grid-auto-rows: 72px; gap: 12px; padding: 16px 24px; }
.tile { background: #fff; border: 1px solid #dadce0; border-radius: 8px; padding: 10px 12px; display: flex; flex-direction: column; overflow: hidden; }
.tile h2 { font-size: 14px; font-weight: 500; margin: 0 0 4px; }
.tile svg { width: 100%; flex: 1; min-height: 0; }
.ax { font-size: 10px; fill: #5f6368; }
.none { font-size: 12px; fill: #80868b; }
.legend { font-size: 11px; color: #3c4043; max-height: 45px; overflow: hidden; }
.legend span { margin-right: 10px; white-space: nowrap; }
.legend i { display: inline-block; width: 10px; height: 3px; margin-right: 4px; vertical-align: 3px; }
.err { color: #d93025; font-size: 11px; }
</style></head><body>
<header><h1>{{.Name}}</h1><div class="sub">{{.Sub}}</div></header>
<div class="grid">
{{range .Tiles}}<div class="tile" style="{{.Style}}"><h2>{{.Title}}</h2>{{.SVG}}
<div class="legend">{{range .Legend}}<span><i style="background:{{.Colour}}"></i>{{.Text}}</span>{{end}}</div>{{if .Err}}<div class="err">{{.Err}}</div>{{end}}</div>
{{end}}</div></body></html>
`))
