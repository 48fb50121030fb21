package pull

import (
	"strings"
	"testing"
	"time"
)

func TestBackoffDoublesUpToTheMaximum(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{{1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {7, 60 * time.Second}, {40, 60 * time.Second}} {
		if got := backoff(time.Second, time.Minute, tc.n); got != tc.want {
			t.Errorf("backoff(1s, 1m, %d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

func TestNewNamesTheMissingOption(t *testing.T) {
	_, err := New(Options{})
	if err == nil || !strings.Contains(err.Error(), "Options.Source is required") {
		t.Fatalf("New(Options{}) = %v, want the missing Source named", err)
	}
}
