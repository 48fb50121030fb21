package consume_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/forward"
)

// forwardTarget is a local service that verifies the forwarder's
// signatures and applies each event once, deduplicating on webhook-id (as
// docs/forwarding.md tells targets to): calls counts the requests, effects the
// events applied. hold, when set, runs inside a call before it answers.
type forwardTarget struct {
	*httptest.Server
	calls   atomic.Int64
	mu      sync.Mutex
	seen    map[string]bool
	effects int
	hold    func(r *http.Request)
}

func (tg *forwardTarget) setHold(f func(r *http.Request)) { tg.mu.Lock(); tg.hold = f; tg.mu.Unlock() }

func (tg *forwardTarget) effectCount() int { tg.mu.Lock(); defer tg.mu.Unlock(); return tg.effects }

func newForwardTarget(t testing.TB, secret string) *forwardTarget {
	tg := &forwardTarget{seen: map[string]bool{}}
	tg.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		tg.calls.Add(1)
		if err := forward.Verify(secret, r.Header, body, time.Now(), 0); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		tg.mu.Lock()
		if id := r.Header.Get("webhook-id"); !tg.seen[id] { // the effect, once per event id
			tg.seen[id] = true
			tg.effects++
		}
		hold := tg.hold
		tg.mu.Unlock()
		if hold != nil {
			hold(r)
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(tg.Close)
	return tg
}

// The forward consumer calls its target with no transaction open: during
// the call the event's claim is committed (another session sees it) and
// the consumer's one-connection pool is free; concurrent deliveries of the
// same event answer 503 in_progress without calling; the 2xx makes the
// claim applied with one success attempt, and a later delivery is a
// duplicate that does not call again.
func TestForwardCallsOutsideTheTransaction(t *testing.T) {
	ctx := context.Background()
	pool, _ := pgtest.SchemaConfig(t, func(c *pgxpool.Config) { c.MaxConns = 1 })
	secret := forward.NewSecret()
	tg := newForwardTarget(t, secret)
	f, err := forward.New(forward.Options{URL: tg.URL, Auth: forward.AuthHMAC, Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	s := newStackOn(t, pool, f, "archive-service")
	m := message(t, orderEvent("order-r1", 1))

	inCall := make(chan string, 1)
	release := make(chan struct{})
	tg.setHold(func(*http.Request) {
		// The engine holds no connection: the pool's only one is free.
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		conn, err := pool.Acquire(actx)
		if err != nil {
			inCall <- "the consumer's only connection is held during the call: " + err.Error()
			<-release
			return
		}
		var state string
		err = conn.QueryRow(actx, `SELECT state FROM relaybus_inbox WHERE event_id = $1`, "order-r1-v1").Scan(&state)
		conn.Release()
		if err != nil {
			state = err.Error()
		}
		inCall <- state
		<-release
	})
	first := make(chan answer, 1)
	go func() { first <- s.push(t, m, 1) }()
	if state := <-inCall; state != "claimed" {
		t.Fatalf("during the call: %s, want the committed claim", state)
	}
	for i := range 3 {
		if a := s.push(t, m, 2+i); a.code != http.StatusServiceUnavailable || a.res.Code != "in_progress" {
			t.Errorf("a concurrent delivery: %+v, want 503 in_progress", a)
		}
	}
	tg.setHold(nil)
	close(release)
	if a := <-first; a.code != 200 || a.res.Outcome != model.OutcomeSuccess || a.res.Attempt != 1 {
		t.Fatalf("the call: %+v, want 200 success at attempt 1", a)
	}
	if a := s.push(t, m, 5); a.code != 200 || !a.res.Duplicate {
		t.Errorf("a later delivery: %+v, want a duplicate", a)
	}
	if n, e := tg.calls.Load(), tg.effectCount(); n != 1 || e != 1 {
		t.Errorf("the target was called %d times (%d effects), want 1", n, e)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_inbox WHERE event_id = 'order-r1-v1' AND state = 'applied'`); n != 1 {
		t.Errorf("inbox row not applied")
	}
	if got := s.shipped(t); len(got) != 1 || !got[0].Success || got[0].AttemptNo != 1 {
		t.Errorf("ledger %+v, want one success", got)
	}

	// A refusal (the target answers 401 to a foreign signature) is a
	// permanent failure: acknowledged, recorded, the claim released.
	other, _ := forward.New(forward.Options{URL: tg.URL, Auth: forward.AuthHMAC, Secrets: []string{forward.NewSecret()}})
	s2 := newStack(t, other, "archive-service")
	m2 := message(t, orderEvent("order-r2", 1))
	if a := s2.push(t, m2, 1); a.code != 200 || a.res.Outcome != model.OutcomeFailed || a.res.Code != "forward_401" {
		t.Errorf("refused by the target: %+v, want 200 failed forward_401", a)
	}
	if n := s2.count(t, `SELECT count(*) FROM relaybus_inbox`); n != 0 {
		t.Errorf("a refused forward left its claim")
	}
}
