package consume_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/consumer"
)

// flowServer serves consume's HTTP handler over s's engine within limits.
func flowServer(t *testing.T, s *stack, limits consume.FlowLimits) string {
	t.Helper()
	h, err := consume.New(consume.Options{Engine: s.engine, DB: s.pool, Flow: limits})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL + "/"
}

type flowAnswer struct {
	code       int
	retryAfter string
	res        consumer.Result
}

func postDelivery(t *testing.T, url string, body []byte) flowAnswer {
	resp, err := http.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return flowAnswer{}
	}
	defer resp.Body.Close()
	a := flowAnswer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
	_ = json.NewDecoder(resp.Body).Decode(&a.res)
	return a
}

// Pushed faster than max_per_second allows and longer than the flow wait:
// consume answers the over-rate deliveries 429 with Retry-After and code
// flow_limited, makes no attempt at them (the inbox counts none), and
// handles the one the rate allowed.
func TestPushOverRateAnswers429WithRetryAfter(t *testing.T) {
	pool := pgtest.Schema(t)
	s := newStackOn(t, pool, appliedLog(t, pool), "member-service")
	// One token every 5 s: after the first, none comes within the wait.
	url := flowServer(t, s, consume.FlowLimits{MaxPerSecond: 0.2, MaxWait: 100 * time.Millisecond})
	const n = 4
	answers := make([]flowAnswer, n)
	var wg sync.WaitGroup
	for i := range n {
		body := delivery.WrappedBody(message(t, orderEvent(fmt.Sprintf("o-%d", i), 1)), "projects/p/subscriptions/"+sub, 1)
		wg.Go(func() { answers[i] = postDelivery(t, url, body) })
	}
	wg.Wait()
	var ok, limited int
	for _, a := range answers {
		switch {
		case a.code == http.StatusOK:
			ok++
		case a.code == http.StatusTooManyRequests && a.res.Code == consume.CodeFlowLimited && a.retryAfter != "" && a.retryAfter != "0":
			limited++
		default:
			t.Errorf("answer %d %q (Retry-After %q): want 200, or 429 flow_limited with a Retry-After", a.code, a.res.Code, a.retryAfter)
		}
	}
	if ok != 1 || limited != n-1 {
		t.Errorf("%d handled, %d answered 429; want 1 and %d", ok, limited, n-1)
	}
	if got := s.count(t, `SELECT count(*) FROM relaybus_attempts`); got != 1 {
		t.Errorf("%d attempts recorded, want 1: a delivery held back is no attempt", got)
	}
}

// Pushed faster than max_per_second allows but within the flow wait:
// every delivery is handled (200), held until its turn, and the handler
// sees them at the rate.
func TestPushHeldToItsRateWithinTheWait(t *testing.T) {
	pool := pgtest.Schema(t)
	var mu sync.Mutex
	var times []time.Time
	inner := appliedLog(t, pool)
	h := consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		return inner.Handle(ctx, c)
	})
	s := newStackOn(t, pool, h, "member-service")
	const perSecond, n = 10.0, 15
	start := time.Now()
	url := flowServer(t, s, consume.FlowLimits{MaxPerSecond: perSecond, MaxWait: 30 * time.Second})
	var wg sync.WaitGroup
	codes := make([]int, n)
	for i := range n {
		body := delivery.WrappedBody(message(t, orderEvent(fmt.Sprintf("o-%d", i), 1)), "projects/p/subscriptions/"+sub, 1)
		wg.Go(func() { codes[i] = postDelivery(t, url, body).code })
	}
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusOK {
			t.Errorf("delivery %d answered %d, want 200", i, c)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	heldToRate(t, start, times, perSecond)
}

// heldToRate asserts the deliveries were held to perSecond: a bucket of
// one token made at or after start lets through, by any time t, at most
// 1 + perSecond·(t − start); the handler notes its time after the gate
// let it through, so load on the machine can only lower the count.
func heldToRate(t *testing.T, start time.Time, times []time.Time, perSecond float64) {
	t.Helper()
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	for k, at := range times {
		if allowed := 1 + perSecond*at.Sub(start).Seconds() + 1e-6; float64(k+1) > allowed {
			t.Fatalf("%d deliveries handled %s after the start; held to %v/s, at most %.2f may be", k+1, at.Sub(start), perSecond, allowed)
		}
	}
}

// An instance whose deliveries were held to its limits reports it in its
// database (relaybus_inbox_flow), where the operators' console reads
// whether the consumer is at its limits: when it last was, and how many
// deliveries it refused.
func TestAnInstanceAtItsLimitsReportsIt(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Schema(t)
	s := newStackOn(t, pool, appliedLog(t, pool), "member-service")
	url := flowServer(t, s, consume.FlowLimits{MaxPerSecond: 0.2, MaxWait: 100 * time.Millisecond, ReportEvery: 20 * time.Millisecond})
	first := time.Now()
	if a := postDelivery(t, url, delivery.WrappedBody(message(t, orderEvent("o-0", 1)), "projects/p/subscriptions/"+sub, 1)); a.code != http.StatusOK {
		t.Fatalf("the first delivery answered %d", a.code)
	}
	var wg sync.WaitGroup
	for i := 1; i <= 3; i++ {
		body := delivery.WrappedBody(message(t, orderEvent(fmt.Sprintf("o-%d", i), 1)), "projects/p/subscriptions/"+sub, 1)
		wg.Go(func() {
			if a := postDelivery(t, url, body); a.code != http.StatusTooManyRequests {
				t.Errorf("a delivery over the rate answered %d, want 429", a.code)
			}
		})
	}
	wg.Wait()
	var got []inbox.FlowReport
	eventually.True(t, 10*time.Second, "the instance's flow report", func() bool {
		var err error
		got, err = inbox.FlowReports(ctx, pool, "member-service")
		return err == nil && len(got) == 1 && got[0].Refused == 3
	})
	if r := got[0]; r.Instance == "" || r.AtLimitAt.Before(first) || time.Since(r.AtLimitAt) > time.Minute {
		t.Errorf("report %+v: want this instance, at a limit after the first delivery", r)
	}
}
