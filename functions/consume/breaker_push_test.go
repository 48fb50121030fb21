package consume_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/forward"
)

// pushHeld posts a wrapped push of m and returns the answer and its
// Retry-After header.
func (s *stack) pushHeld(t *testing.T, m event.Message, attempt int) (answer, string) {
	t.Helper()
	resp, err := http.Post(s.url, "application/json", bytes.NewReader(delivery.WrappedBody(m, "projects/p/subscriptions/"+sub, attempt)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a answer
	a.code = resp.StatusCode
	_ = json.NewDecoder(resp.Body).Decode(&a.res)
	return a, resp.Header.Get("Retry-After")
}

// A forward consumer's breaker over push, through consume's HTTP handler,
// on the breaker's own clock: FORWARD_BREAKER_THRESHOLD failures open it;
// while open, deliveries answer 503 held with Retry-After at once, never
// call the target and record no attempt (the consumer's attempt count
// and its dead-letter decision see none of them, however many come);
// after the cool-down one delivery probes and its success closes the
// breaker; a 429 with Retry-After opens it at once for at least that
// long.
func TestForwardBreakerOverPush(t *testing.T) {
	var (
		mu     sync.Mutex
		now    = time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC)
		status = http.StatusServiceUnavailable
		header = ""
		calls  atomic.Int64
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	answer := func(code int, retryAfter string) { mu.Lock(); status, header = code, retryAfter; mu.Unlock() }
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		mu.Lock()
		code, h := status, header
		mu.Unlock()
		if h != "" {
			w.Header().Set("Retry-After", h)
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(tg.Close)
	f, err := forward.New(forward.Options{URL: tg.URL, Now: clock,
		Breaker: forward.BreakerOptions{Threshold: 2, CoolDown: 30 * time.Second, MaxCoolDown: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	s := newStack(t, f, "archive-service")
	m := message(t, orderEvent("order-b1", 1))
	attempts := func() int {
		return s.count(t, `SELECT count(*) FROM relaybus_attempts WHERE event_id = 'order-b1-v1'`)
	}

	if a, _ := s.pushHeld(t, m, 1); a.code != 503 || a.res.Outcome != model.OutcomeRetry || a.res.Attempt != 1 {
		t.Fatalf("first failure: %+v, want 503 retry at attempt 1", a)
	}
	// The threshold's failure opens the breaker: held, not an attempt.
	if a, ra := s.pushHeld(t, m, 2); a.code != 503 || a.res.Code != consumer.CodeHeld || a.res.Outcome != "" || ra != "30" {
		t.Fatalf("the failure that opens the breaker: %+v, Retry-After %q; want 503 held, Retry-After 30", a, ra)
	}
	// Open: any number of deliveries, past max attempts, are held at once.
	for n := 3; n <= 9; n++ {
		advance(time.Second)
		if a, ra := s.pushHeld(t, m, n); a.code != 503 || a.res.Code != consumer.CodeHeld || a.res.Outcome != "" || a.res.Attempt != 0 || ra == "" {
			t.Fatalf("delivery %d while open: %+v, Retry-After %q; want 503 held, no attempt", n, a, ra)
		}
	}
	if c, n := calls.Load(), attempts(); c != 2 || n != 1 {
		t.Fatalf("while open: the target was called %d times and %d attempts recorded; want 2 and 1", c, n)
	}
	if st := f.BreakerState(); st != forward.Open {
		t.Fatalf("breaker %s, want open", st)
	}

	// After the cool-down the target is back: the probe delivers, as
	// attempt 2 (the held calls took no number), and closes the breaker.
	advance(30 * time.Second)
	answer(http.StatusOK, "")
	if a, _ := s.pushHeld(t, m, 10); a.code != 200 || a.res.Outcome != model.OutcomeSuccess || a.res.Attempt != 2 {
		t.Fatalf("the probe: %+v, want 200 success at attempt 2", a)
	}
	if st := f.BreakerState(); st != forward.Closed {
		t.Fatalf("after the probe: breaker %s, want closed", st)
	}

	// A 429 with Retry-After (an HTTP date, two minutes ahead) opens it at
	// once, for those two minutes rather than the 30 s cool-down.
	answer(http.StatusTooManyRequests, clock().Add(2*time.Minute).Format(http.TimeFormat))
	m2 := message(t, orderEvent("order-b2", 1))
	if a, ra := s.pushHeld(t, m2, 1); a.res.Code != consumer.CodeHeld || ra != "120" {
		t.Fatalf("429 Retry-After: %+v, Retry-After %q; want held for 120 s", a, ra)
	}
	advance(time.Minute)
	answer(http.StatusOK, "")
	before := calls.Load()
	if a, _ := s.pushHeld(t, m2, 2); a.res.Code != consumer.CodeHeld || calls.Load() != before {
		t.Fatalf("a minute into the target's Retry-After: %+v (target called: %v); want held", a, calls.Load() != before)
	}
	advance(time.Minute)
	if a, _ := s.pushHeld(t, m2, 3); a.code != 200 || a.res.Outcome != model.OutcomeSuccess || a.res.Attempt != 1 {
		t.Fatalf("after the target's Retry-After: %+v, want 200 success at attempt 1", a)
	}
}
