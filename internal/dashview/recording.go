package dashview

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Recording is a run's metrics as a manual reader collected them, one
// snapshot at a time (cumulative, as the SDK's readers report by default).
type Recording struct {
	snaps []snapshot
}

type snapshot struct {
	at     time.Time
	series map[string]sample
}

// sample is one series' value in a snapshot.
type sample struct {
	labels map[string]string // __name__ included
	value  float64
	// cumulative: a counter or histogram series, 0 wherever the run had not
	// recorded it yet (the reader's provider started with the run).
	cumulative bool
}

// Add records the metrics collected at at.
func (r *Recording) Add(at time.Time, rm metricdata.ResourceMetrics) {
	s := snapshot{at: at, series: map[string]sample{}}
	put := func(name string, attrs attribute.Set, extra map[string]string, v float64, cumulative bool) {
		l := map[string]string{"__name__": name}
		for _, kv := range attrs.ToSlice() {
			l[string(kv.Key)] = kv.Value.String()
		}
		for k, v := range extra {
			l[k] = v
		}
		s.series[key(l)] = sample{labels: l, value: v, cumulative: cumulative}
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					put(m.Name, p.Attributes, nil, float64(p.Value), d.IsMonotonic)
				}
			case metricdata.Sum[float64]:
				for _, p := range d.DataPoints {
					put(m.Name, p.Attributes, nil, p.Value, d.IsMonotonic)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					put(m.Name, p.Attributes, nil, float64(p.Value), false)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					put(m.Name, p.Attributes, nil, p.Value, false)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					histogram(put, m.Name, p.Attributes, p.Bounds, p.BucketCounts, p.Count, p.Sum)
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					histogram(put, m.Name, p.Attributes, p.Bounds, p.BucketCounts, p.Count, float64(p.Sum))
				}
			}
		}
	}
	r.snaps = append(r.snaps, s)
}

// histogram writes a histogram point as Prometheus's series: cumulative
// buckets by upper bound (le, +Inf last), the count and the sum.
func histogram(put func(string, attribute.Set, map[string]string, float64, bool), name string, attrs attribute.Set, bounds []float64, counts []uint64, count uint64, sum float64) {
	var cum uint64
	for i, c := range counts {
		cum += c
		le := "+Inf"
		if i < len(bounds) {
			le = strconv.FormatFloat(bounds[i], 'g', -1, 64)
		}
		put(name+"_bucket", attrs, map[string]string{"le": le}, float64(cum), true)
	}
	put(name+"_count", attrs, nil, float64(count), true)
	put(name+"_sum", attrs, nil, sum, true)
}

// Len is how many snapshots it holds.
func (r *Recording) Len() int { return len(r.snaps) }

// key is a label set's identity: its pairs, sorted.
func key(l map[string]string) string {
	ks := make([]string, 0, len(l))
	for k := range l {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(l[k])
		b.WriteByte(0)
	}
	return b.String()
}

// value returns series k's value at snapshot i: its sample, or 0 for a
// cumulative series not recorded yet; ok is false when it has none.
func (r *Recording) value(i int, k string, cumulative bool) (float64, bool) {
	if s, ok := r.snaps[i].series[k]; ok {
		return s.value, true
	}
	if cumulative {
		return 0, true
	}
	return math.NaN(), false
}
