// Package percentile is the one rank rule every relaybus figure uses: the
// nearest-rank percentile, as docs/benchmarks.md states for the benchmarks and
// as the console's overview reports.
//
// The nearest-rank p-th percentile of n samples is the sample at rank
// ceil(p·n) in ascending order (1-based): the smallest sample such that at
// least a fraction p of all samples are at or below it. It is always one of
// the samples, never an interpolation, so p99 of 100 samples is the 99th
// smallest and the maximum is p = 1.
package percentile

import (
	"math"
	"slices"
	"time"
)

// Rank is the 0-based index of the nearest-rank p-th percentile in n sorted
// samples; p is clamped to [0, 1]. It is -1 for no sample.
func Rank(n int, p float64) int {
	if n <= 0 {
		return -1
	}
	p = min(max(p, 0), 1)
	// The epsilon keeps 0.99*100 = 99.00000000000001 at rank 99, not 100.
	r := int(math.Ceil(p*float64(n)-1e-9)) - 1
	return min(max(r, 0), n-1)
}

// Of sorts xs in place and returns its nearest-rank p-th percentile
// (0 < p <= 1), or 0 when xs is empty.
func Of(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[Rank(len(xs), p)]
}

// OfDurations is Of for durations.
func OfDurations(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[Rank(len(ds), p)]
}

// Sorted returns the nearest-rank p-th percentile of xs, already sorted in
// ascending order (0 when empty), for callers that read several
// percentiles of one sorted sample.
func Sorted[T int64 | float64 | time.Duration](xs []T, p float64) T {
	if len(xs) == 0 {
		return 0
	}
	return xs[Rank(len(xs), p)]
}
