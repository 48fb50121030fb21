package benchcheck

import (
	"fmt"
	"strings"
	"testing"
)

func TestSinkFindsWhatARunGotWrong(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		got                         []string
		lost, dup, reordered, unexp int
	}{
		{"whole", []string{"1", "2", "3", "4"}, 0, 0, 0, 0},
		{"lost", []string{"1", "2", "4"}, 1, 0, 0, 0},
		{"duplicated", []string{"1", "2", "2", "3", "4"}, 0, 1, 0, 0},
		{"reordered", []string{"1", "3", "2", "4"}, 0, 0, 1, 0},
		{"redelivered after its successor", []string{"1", "2", "3", "2", "4"}, 0, 1, 0, 0},
		{"unexpected", []string{"1", "2", "3", "4", "x"}, 0, 0, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewDetailedSink()
			for _, id := range []string{"1", "2", "3", "4"} {
				s.Sent("k", id)
				s.Sent("other", id)
			}
			for _, id := range []string{"1", "2", "3", "4"} {
				s.Got("other", id)
			}
			for _, id := range tc.got {
				s.Got("k", id)
			}
			r := s.Check()
			if r.Lost != tc.lost || r.Duplicated != tc.dup || r.Reordered != tc.reordered || r.Unexpected != tc.unexp {
				t.Errorf("report %s; want lost %d, duplicated %d, reordered %d, unexpected %d", r, tc.lost, tc.dup, tc.reordered, tc.unexp)
			}
			whole := tc.name == "whole"
			if r.OK() != whole || (r.Checksum == r.SentChecksum) != whole {
				t.Errorf("OK %v, checksums %x/%x; want OK and equal checksums only for the whole run", r.OK(), r.Checksum, r.SentChecksum)
			}
			if r.Sent != 8 || r.Keys != 2 {
				t.Errorf("sent %d on %d keys, want 8 on 2", r.Sent, r.Keys)
			}
		})
	}
}

// A key applied in another order has another checksum, even when the
// counts match.
func TestChecksumFollowsOrder(t *testing.T) {
	a, b := NewSink(), NewSink()
	for i := range 5 {
		a.Got("k", fmt.Sprint(i))
		b.Got("k", fmt.Sprint(4-i))
	}
	if a.Check().Checksum == b.Check().Checksum {
		t.Error("the same items in two orders have one checksum")
	}
}

func TestReportNamesExamples(t *testing.T) {
	s := NewDetailedSink()
	s.Sent("order-1", "v1")
	s.Sent("order-1", "v2")
	s.Got("order-1", "v2")
	s.Got("order-1", "v1")
	if r := s.Check(); !strings.Contains(r.String(), "key order-1: sent [v1 v2], applied [v2 v1]") {
		t.Errorf("report %q does not name the key and both sequences", r)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(tc.xs); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
	}
}

func TestUnorderedSinkIgnoresOrderOnly(t *testing.T) {
	s := NewUnorderedSink()
	for _, id := range []string{"1", "2", "3"} {
		s.Sent("k", id)
	}
	for _, id := range []string{"3", "1", "2"} {
		s.Got("k", id)
	}
	if r := s.Check(); !r.OK() {
		t.Errorf("another order: %s, want OK", r)
	}
	s.Got("k", "1")
	if r := s.Check(); r.OK() || r.Duplicated != 1 {
		t.Errorf("a duplicate: %s, want it counted", r)
	}
}

// A sink that keeps only checksums and counts finds the same runs whole
// or broken, and says how by counts.
func TestCountingSinkFindsWhatARunGotWrong(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		got                  []string
		lost, dup, reordered int
	}{
		{"whole", []string{"1", "2", "3"}, 0, 0, 0},
		{"lost", []string{"1", "3"}, 1, 0, 0},
		{"duplicated", []string{"1", "2", "2", "3"}, 0, 1, 0},
		{"reordered", []string{"2", "1", "3"}, 0, 0, 1},
	} {
		s := NewSink()
		for _, id := range []string{"1", "2", "3"} {
			s.Sent("k", id)
		}
		for _, id := range tc.got {
			s.Got("k", id)
		}
		r := s.Check()
		if r.OK() != (tc.name == "whole") || r.Lost != tc.lost || r.Duplicated != tc.dup || r.Reordered != tc.reordered || !r.Counted {
			t.Errorf("%s: report %s", tc.name, r)
		}
	}
	d, c := NewDetailedSink(), NewSink()
	for _, s := range []*Sink{d, c} {
		s.Sent("k", "a")
		s.Sent("k", "b")
		s.Got("k", "a")
		s.Got("k", "b")
	}
	if rd, rc := d.Check(), c.Check(); rd.Checksum != rc.Checksum || rd.SentChecksum != rc.SentChecksum {
		t.Errorf("the two kinds of sink fold different checksums: %s / %s", rd, rc)
	}
}
