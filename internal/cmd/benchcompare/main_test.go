package main

import (
	"math"
	"strings"
	"testing"
)

func TestTableSaysWhatTheRoundsShow(t *testing.T) {
	nan := math.NaN()
	figures := map[string]map[string][]float64{
		"base": {"steady_per_s": {100, 100, 100}, "noisy_ms": {10, 20, 10}, "new_per_s": {nan, nan, nan}},
		"head": {"steady_per_s": {120, 118, 122}, "noisy_ms": {11, 10, 19}, "new_per_s": {5, 5, 5}},
	}
	units := map[string]string{"steady_per_s": "ev/s", "noisy_ms": "ms", "new_per_s": "ev/s"}
	var b strings.Builder
	printTable(&b, []string{"steady_per_s", "noisy_ms", "new_per_s"}, units, figures, 3)
	out := b.String()
	for _, want := range []string{
		"| steady_per_s | ev/s | 100 | 120 | 1.200 | 1.180..1.220 |  |",
		"| noisy_ms | ms | 10 | 11 | 1.100 | 0.500..1.900 | rounds spread more than the effect |",
		"| new_per_s | ev/s | – | 5 | – | – | not printed by the base |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestBenchLine(t *testing.T) {
	m := benchLine.FindStringSubmatch("BENCH relay_events_per_s 44119.5 ev/s")
	if m == nil || m[1] != "relay_events_per_s" || m[2] != "44119.5" || m[3] != "ev/s" {
		t.Fatalf("parsed %q", m)
	}
	if benchLine.FindStringSubmatch("# BENCH in a comment 1 x") != nil {
		t.Error("a comment line parsed as a figure")
	}
}
