// Package benchcheck is what relaybus's benchmarks report through and what
// voids their figures. A figure is printed as a `BENCH <name> <value>
// <unit>` line (the format `make bench` and `make bench-compare` read) and
// reported with testing.B.ReportMetric under its name, so benchstat can
// compare runs too. A Sink checks what a run delivered against what it
// sent, per ordering key: a run that lost, duplicated or reordered
// anything fails instead of printing figures from it.
package benchcheck

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Figure prints the BENCH line of figure name and reports it as b's
// metric name (benchstat's unit). The value is rounded to two decimals.
func Figure(b testing.TB, name string, value float64, unit string) {
	b.Helper()
	if math.IsNaN(value) || math.IsInf(value, 0) {
		b.Fatalf("benchmark figure %s is %v: not a number", name, value)
	}
	v := math.Round(value*100) / 100
	fmt.Printf("BENCH %s %s %s\n", name, strconv.FormatFloat(v, 'f', -1, 64), unit)
	if bb, ok := b.(*testing.B); ok {
		bb.ReportMetric(v, name)
	}
}

// Sink compares, per ordering key, the items a run sent (in the order
// they were sent: an aggregate's versions) with the items it saw applied,
// each side folded into a running checksum of the key's sequence. It is
// safe for concurrent use.
//
// A sink keeps, per key, its two checksums and counts, so it costs a
// benchmark's heap next to nothing whatever the run's size (the relay's
// heap is one of its figures); NewDetailedSink also keeps every id, to
// tell lost, duplicated and reordered items apart.
type Sink struct {
	mu        sync.Mutex
	sent      map[string]*stream
	got       map[string]*stream
	detailed  bool
	unordered bool
}

type stream struct {
	sum uint64
	n   int
	ids []string // kept by a detailed sink
}

// fold is the running checksum: id folded into the checksum of the items
// before it (FNV-1a), so it changes with the order, a missing item and a
// repeated one.
func fold(sum uint64, id string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(sum >> (8 * i))
	}
	h.Write(b[:])
	h.Write([]byte(id))
	return h.Sum64()
}

func checksum(ids []string) uint64 {
	var sum uint64
	for _, id := range ids {
		sum = fold(sum, id)
	}
	return sum
}

// NewSink returns an empty sink that keeps checksums and counts.
func NewSink() *Sink { return &Sink{sent: map[string]*stream{}, got: map[string]*stream{}} }

// NewDetailedSink returns an empty sink that also keeps every id, so its
// report tells lost, duplicated and reordered items apart.
func NewDetailedSink() *Sink {
	s := NewSink()
	s.detailed = true
	return s
}

// NewUnorderedSink returns an empty detailed sink for a delivery that
// does not promise order (Eventarc's): only what was lost, duplicated or
// never sent counts.
func NewUnorderedSink() *Sink {
	s := NewDetailedSink()
	s.unordered = true
	return s
}

// Sent records that id was sent on key, after the key's earlier items.
func (s *Sink) Sent(key, id string) { s.add(s.sent, key, id) }

// Got records that id was applied (or received) on key, after the key's
// earlier items.
func (s *Sink) Got(key, id string) { s.add(s.got, key, id) }

func (s *Sink) add(m map[string]*stream, key, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addLocked(m, key, id)
}

func (s *Sink) addLocked(m map[string]*stream, key, id string) {
	st := m[key]
	if st == nil {
		st = &stream{}
		m[key] = st
	}
	st.n++
	if s.detailed {
		st.ids = append(st.ids, id)
		return
	}
	st.sum = fold(st.sum, id)
}

// Report is what a Sink found.
type Report struct {
	Keys, Sent, Got                         int
	Lost, Duplicated, Reordered, Unexpected int
	// Checksum folds every key's running checksum of what was applied;
	// it equals the sent side's when nothing was lost, duplicated or
	// reordered.
	Checksum, SentChecksum uint64
	// Examples names a few keys that differ and how.
	Examples []string
	// Counted says the sink kept no ids: Lost and Duplicated are the
	// keys' missing and extra counts, Reordered the keys that got all
	// their items in another order (or lost one and got another twice).
	Counted bool
}

// OK reports whether every key got exactly what was sent, in order.
func (r Report) OK() bool {
	return r.Lost+r.Duplicated+r.Reordered+r.Unexpected == 0 && r.Checksum == r.SentChecksum
}

// String is one line for a benchmark's comment.
func (r Report) String() string {
	reordered := fmt.Sprintf("reordered %d", r.Reordered)
	if r.Counted {
		reordered = fmt.Sprintf("keys out of order %d", r.Reordered)
	}
	s := fmt.Sprintf("%d items on %d keys sent, %d applied; lost %d, duplicated %d, %s, unexpected %d; checksum %016x (sent %016x)",
		r.Sent, r.Keys, r.Got, r.Lost, r.Duplicated, reordered, r.Unexpected, r.Checksum, r.SentChecksum)
	if len(r.Examples) > 0 {
		s += "; e.g. " + strings.Join(r.Examples, "; ")
	}
	return s
}

// Check compares both sides.
func (s *Sink) Check() Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	var r Report
	keys := map[string]bool{}
	for k := range s.sent {
		keys[k] = true
	}
	for k := range s.got {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	r.Keys = len(s.sent)
	r.Counted = !s.detailed
	for _, k := range sorted {
		var sent, got stream
		if st := s.sent[k]; st != nil {
			sent = *st
		}
		if st := s.got[k]; st != nil {
			got = *st
		}
		if s.unordered {
			sent.ids, got.ids = slices.Sorted(slices.Values(sent.ids)), slices.Sorted(slices.Values(got.ids))
		}
		if s.detailed {
			sent.sum, got.sum = checksum(sent.ids), checksum(got.ids)
		}
		r.Sent += sent.n
		r.Got += got.n
		r.SentChecksum = r.SentChecksum*31 + sent.sum
		r.Checksum = r.Checksum*31 + got.sum
		if sent.sum == got.sum && sent.n == got.n {
			continue
		}
		if s.detailed {
			lost, dup, reord, unexp := compare(sent.ids, got.ids)
			r.Lost += lost
			r.Duplicated += dup
			r.Reordered += reord
			r.Unexpected += unexp
			if len(r.Examples) < 3 {
				r.Examples = append(r.Examples, fmt.Sprintf("key %s: sent %s, applied %s", k, abbrev(sent.ids), abbrev(got.ids)))
			}
			continue
		}
		switch {
		case got.n < sent.n:
			r.Lost += sent.n - got.n
		case got.n > sent.n:
			r.Duplicated += got.n - sent.n
		default:
			r.Reordered++
		}
		if len(r.Examples) < 3 {
			r.Examples = append(r.Examples, fmt.Sprintf("key %s: %d sent, %d applied, checksums %016x/%016x", k, sent.n, got.n, sent.sum, got.sum))
		}
	}
	return r
}

// compare classifies how got differs from sent: items never applied,
// applied more than once, applied out of their sent order (counted once
// each, as the applied items that came before an earlier-sent one), and
// applied but never sent.
func compare(sent, got []string) (lost, dup, reordered, unexpected int) {
	pos := make(map[string]int, len(sent))
	for i, id := range sent {
		pos[id] = i
	}
	seen := map[string]bool{}
	last := -1
	for _, id := range got {
		p, ok := pos[id]
		switch {
		case !ok:
			unexpected++
		case seen[id]:
			dup++
		default:
			seen[id] = true
			if p < last {
				reordered++
			}
			last = max(last, p)
		}
	}
	for _, id := range sent {
		if !seen[id] {
			lost++
		}
	}
	return lost, dup, reordered, unexpected
}

func abbrev(ids []string) string {
	if len(ids) <= 6 {
		return "[" + strings.Join(ids, " ") + "]"
	}
	return fmt.Sprintf("[%s … %s] (%d)", strings.Join(ids[:3], " "), strings.Join(ids[len(ids)-2:], " "), len(ids))
}

// Require fails b unless the sink's run is whole, and otherwise prints
// the comment line that says what the figures cover (what, e.g. "relay
// drain").
func (s *Sink) Require(b testing.TB, what string) Report {
	b.Helper()
	r := s.Check()
	if !r.OK() {
		b.Fatalf("%s: the run did not deliver what it sent, so it prints no figure: %s", what, r)
	}
	fmt.Printf("# %s: every item arrived once and in order per key: %s\n", what, r)
	return r
}

// Overhead reports figure name, the cost of a treatment (telemetry on, a
// schema, a pooler) in percent, from rounds run interleaved (base,
// treated, base, treated, …) so that a drift of the machine or the process
// over the run falls on both sides. Each round pairs base[i] with
// treated[i]; its overhead is (base − treated) / base × 100 for a
// throughput (higherIsBetter), (treated − base) / base × 100 for a latency
// or a cost. The figure is the median of the rounds' overheads; its
// comment line gives every round and the spread, and says so when the
// rounds spread more than the effect: the run cannot tell it from noise.
func Overhead(b testing.TB, name, what string, base, treated []float64, higherIsBetter bool) {
	b.Helper()
	pcts := Compare(b, name, what, base, treated, higherIsBetter)
	Figure(b, name, Median(pcts), "%")
}

// Compare prints the comment line of interleaved rounds (see Overhead)
// and returns each round's overhead in percent.
func Compare(b testing.TB, name, what string, base, treated []float64, higherIsBetter bool) []float64 {
	b.Helper()
	if len(base) != len(treated) || len(base) == 0 {
		b.Fatalf("%s: %d base and %d treated rounds: want as many of each, at least one", name, len(base), len(treated))
	}
	pcts := make([]float64, len(base))
	for i := range base {
		if base[i] <= 0 {
			b.Fatalf("%s: round %d's base figure is %v", name, i+1, base[i])
		}
		if higherIsBetter {
			pcts[i] = (base[i] - treated[i]) / base[i] * 100
		} else {
			pcts[i] = (treated[i] - base[i]) / base[i] * 100
		}
	}
	med := Median(pcts)
	lo, hi := slices.Min(pcts), slices.Max(pcts)
	var rounds []string
	for i := range base {
		rounds = append(rounds, fmt.Sprintf("%.4g→%.4g (%+.1f%%)", base[i], treated[i], pcts[i]))
	}
	fmt.Printf("# %s: %s; %d rounds interleaved (base, treated, …): %s; overhead median %.1f%%, spread %.1f..%.1f%%\n",
		name, what, len(base), strings.Join(rounds, ", "), med, lo, hi)
	if hi-lo > math.Abs(med) {
		fmt.Printf("# %s: the rounds spread %.1f points, more than the effect (%.1f%%): this run cannot tell it from noise\n", name, hi-lo, med)
	}
	return pcts
}

// Median is the median of xs (the mean of the middle two for an even
// count); xs is not changed.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
