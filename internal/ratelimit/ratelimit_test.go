package ratelimit_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ratelimit"
)

// Each caller has its own bucket: a burst, then one request per 1/rate,
// and a refusal says how long to wait.
func TestLimiterPerCaller(t *testing.T) {
	now := time.Unix(1000, 0)
	l := ratelimit.New(ratelimit.Options{Rate: 2, Burst: 3, Now: func() time.Time { return now }})
	for i := range 3 {
		if ok, _ := l.Allow("alice"); !ok {
			t.Fatalf("request %d of the burst refused", i+1)
		}
	}
	ok, wait := l.Allow("alice")
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("4th request: %v, wait %s; want refused, 500ms", ok, wait)
	}
	if ok, _ := l.Allow("bob"); !ok {
		t.Fatal("bob refused for alice's requests")
	}
	now = now.Add(500 * time.Millisecond)
	if ok, _ := l.Allow("alice"); !ok {
		t.Fatal("alice refused after the refill")
	}
	if ok, _ := l.Allow("alice"); ok {
		t.Fatal("alice allowed twice after one refill")
	}
	off := ratelimit.New(ratelimit.Options{})
	if ok, _ := off.Allow("x"); off != nil || !ok {
		t.Fatal("a zero rate must turn the limiter off")
	}
	h := http.Header{}
	ratelimit.RetryAfter(h, 1200*time.Millisecond)
	if h.Get("Retry-After") != "2" {
		t.Errorf("Retry-After %q, want 2", h.Get("Retry-After"))
	}
}

// Past MaxKeys, idle callers' buckets (full again anyway) are dropped; a
// busy caller's empty bucket is kept, so nobody escapes the limit by
// making many callers appear.
func TestLimiterDropsIdleBucketsOnly(t *testing.T) {
	now := time.Unix(1000, 0)
	l := ratelimit.New(ratelimit.Options{Rate: 1, Burst: 1, MaxKeys: 3, Now: func() time.Time { return now }})
	l.Allow("idle")
	now = now.Add(100 * time.Millisecond)
	l.Allow("a")
	l.Allow("b")
	now = now.Add(950 * time.Millisecond) // "idle" is full again, "a" and "b" are not
	l.Allow("c")
	if ok, _ := l.Allow("a"); ok {
		t.Error("a's empty bucket was dropped and refilled")
	}
}
