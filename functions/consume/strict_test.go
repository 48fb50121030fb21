package consume_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/projection"
)

// testClock is an injected clock the test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *testClock) Advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// logBuffer collects JSON log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the logged records with message msg.
func (l *logBuffer) lines(msg string) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(l.b.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// post POSTs body (JSON-encoded unless nil) to one of consume's routes and
// decodes the answer into out.
func (s *stack) post(t testing.TB, route string, body any, out any, header ...string) int {
	t.Helper()
	var r *bytes.Reader
	if body == nil {
		r = bytes.NewReader(nil)
	} else {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(http.MethodPost, s.url+route, r)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("POST %s: %d, undecodable answer: %v", route, resp.StatusCode, err)
		}
	}
	return resp.StatusCode
}

type gapList struct {
	Gaps       []projection.Gap `json:"gaps"`
	GapTimeout string           `json:"gapTimeout"`
}

// latestAttempts returns each event's latest attempt in the ledger.
func latestAttempts(as []model.Attempt) map[string]model.Attempt {
	out := map[string]model.Attempt{}
	for _, a := range as {
		if cur, ok := out[a.EventID]; !ok || a.AttemptNo > cur.AttemptNo {
			out[a.EventID] = a
		}
	}
	return out
}

// A gap that never closes: version 2 of an aggregate never arrives.
// Versions 3 to 6 are parked and acknowledged; POST /gaps:check reports
// nothing until the oldest has waited the gap timeout (the injected clock),
// then reports the gap once: an ERROR log, a stalled attempt for each
// parked event in Postgres and the ledger, the count. An operator's POST
// /gaps:skip of version 2 applies 3 to 6 in order, each with a success
// attempt in the ledger; a late version 2 is acknowledged without effect.
func TestGapThatNeverClosesIsReportedThenReleasedBySkip(t *testing.T) {
	pool := pgtest.Schema(t)
	clock := &testClock{now: time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)}
	logs := &logBuffer{}
	res := projection.NewStrict(appliedLog(t, pool), projection.StrictOptions{GapTimeout: 10 * time.Minute, Now: clock.Now,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	s := newStackWith(t, pool, res, "audit-service", nil)
	const agg = "order-g"
	if a := s.push(t, message(t, orderEvent(agg, 1)), 1); a.code != 200 || a.res.Outcome != model.OutcomeSuccess {
		t.Fatalf("v1: %+v", a)
	}
	for v := int64(6); v >= 3; v-- {
		a := s.push(t, message(t, orderEvent(agg, v)), 1)
		if a.code != 200 || a.res.Outcome != model.OutcomeParked || a.res.Code != "gap" {
			t.Fatalf("v%d before v2: %+v, want 200 parked", v, a)
		}
		clock.Advance(time.Minute)
	}
	if a := s.push(t, message(t, orderEvent(agg, 4)), 2); a.code != 200 || !a.res.Duplicate {
		t.Errorf("a parked event delivered again: %+v, want a duplicate", a)
	}
	var gl gapList
	if code := s.post(t, "gaps", nil, &gl); code != 200 || len(gl.Gaps) != 1 || gl.GapTimeout != "10m0s" {
		t.Fatalf("POST /gaps: %d %+v", code, gl)
	}
	if g := gl.Gaps[0]; g.AggregateID != agg || g.Applied != 1 || g.Missing != 2 || g.FirstParked != 3 || g.Parked != 4 || g.Overdue || g.Reported {
		t.Errorf("gap %+v, want applied 1, missing 2, first parked 3, 4 parked, not overdue", g)
	}

	// The oldest (v6) was parked at 9:00; it is 9:04 now. Just before the
	// timeout nothing is reported; just after, the gap is, once.
	var rep projection.CheckReport
	clock.Advance(5*time.Minute + 59*time.Second)
	if code := s.post(t, "gaps:check", nil, &rep); code != 200 || rep.Gaps != 1 || rep.Stalled != 0 {
		t.Fatalf("check before the timeout: %d %+v", code, rep)
	}
	if n := len(logs.lines("consume: version gap past its time")); n != 0 {
		t.Fatalf("reported before its time (%d log lines)", n)
	}
	clock.Advance(2 * time.Second)
	if code := s.post(t, "gaps:check", nil, &rep); code != 200 || rep.Stalled != 1 || rep.StalledTotal != 1 {
		t.Fatalf("check past the timeout: %d %+v, want 1 stalled", code, rep)
	}
	if code := s.post(t, "gaps:check", nil, &rep); code != 200 || rep.Stalled != 0 || rep.StalledTotal != 1 {
		t.Errorf("a second check: %d %+v, want the gap reported once", code, rep)
	}
	lines := logs.lines("consume: version gap past its time")
	if len(lines) != 1 || lines[0]["level"] != "ERROR" || lines[0]["aggregate_id"] != agg || lines[0]["missing_version"] != float64(2) ||
		lines[0]["parked"] != float64(4) || lines[0]["consumer_id"] != "audit-service" {
		t.Errorf("gap log lines %v, want one ERROR naming the aggregate and missing version 2", lines)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_attempts WHERE outcome = 'stalled' AND error_code = 'gap_timeout'`); n != 4 {
		t.Errorf("%d stalled attempts, want one per parked event (4)", n)
	}
	latest := latestAttempts(s.shipped(t))
	for v := 3; v <= 6; v++ {
		a := latest[fmt.Sprintf("%s-v%d", agg, v)]
		if a.Outcome != model.OutcomeStalled || a.ErrorCode != "gap_timeout" || !strings.Contains(a.ErrorMessage, "version 2 of order/order-g has been missing") {
			t.Errorf("v%d: ledger's latest attempt %+v, want stalled", v, a)
		}
		if st := model.Derive(model.Facts{Expected: []string{"audit-service"}, Latest: map[string]model.Attempt{"audit-service": a}, Sent: true}); st != model.StatusFailed {
			t.Errorf("v%d: status %s, want FAILED while stalled", v, st)
		}
	}
	if code := s.post(t, "gaps", map[string]string{"aggregateId": agg}, &gl); code != 200 || len(gl.Gaps) != 1 || !gl.Gaps[0].Overdue || !gl.Gaps[0].Reported {
		t.Errorf("POST /gaps after the report: %d %+v", code, gl)
	}

	// Refusals say the rule.
	var refusal struct{ Code, Message string }
	if code := s.post(t, "gaps:skip", map[string]any{"aggregateId": agg, "version": 3}, &refusal); code != http.StatusConflict || refusal.Code != "not_missing" ||
		!strings.Contains(refusal.Message, "2 is") {
		t.Errorf("skip of a parked version: %d %+v", code, refusal)
	}
	if code := s.post(t, "gaps:skip", map[string]any{"aggregateId": agg, "version": 2, "through": 3}, &refusal); code != http.StatusConflict || refusal.Code != "parked" {
		t.Errorf("skip through a parked version: %d %+v", code, refusal)
	}
	if applied := appliedVersions(t, s)[agg]; fmt.Sprint(applied) != "[1]" {
		t.Fatalf("applied %v before the release, want [1]", applied)
	}

	// The operator skips version 2 (aggregateType left out: one gap has
	// that id); 3..6 follow in order.
	claims := base64.RawURLEncoding.EncodeToString([]byte(`{"email":"oncall@example.com"}`))
	var skip projection.SkipResult
	if code := s.post(t, "gaps:skip", map[string]any{"aggregateId": agg, "version": 2, "reason": "lost in the migration"}, &skip,
		"Authorization", "Bearer e30."+claims+".SIGNATURE_REMOVED_BY_GOOGLE"); code != 200 ||
		fmt.Sprint(skip.Skipped) != "[2]" || fmt.Sprint(skip.Applied) != "[3 4 5 6]" || skip.Gap != nil || skip.AggregateType != "order" {
		t.Fatalf("skip: %d %+v", code, skip)
	}
	if applied := appliedVersions(t, s)[agg]; fmt.Sprint(applied) != "[1 3 4 5 6]" {
		t.Errorf("applied %v, want [1 3 4 5 6]", applied)
	}
	var by string
	_ = pool.QueryRow(context.Background(), `SELECT skipped_by || ': ' || reason FROM relaybus_strict_skipped WHERE aggregate_id = $1 AND version = 2`, agg).Scan(&by)
	if by != "oncall@example.com: lost in the migration" {
		t.Errorf("skip recorded as %q", by)
	}
	latest = latestAttempts(s.shipped(t))
	for v := 3; v <= 6; v++ {
		if a := latest[fmt.Sprintf("%s-v%d", agg, v)]; !a.Success {
			t.Errorf("v%d: ledger's latest attempt %+v, want the success of its release", v, a)
		}
	}
	if code := s.post(t, "gaps", nil, &gl); code != 200 || len(gl.Gaps) != 0 {
		t.Errorf("gaps after the release: %+v", gl)
	}

	// Version 2 turns up after all: acknowledged, no effect, said so.
	if a := s.push(t, message(t, orderEvent(agg, 2)), 1); a.code != 200 || a.res.Outcome != model.OutcomeFailed || a.res.Code != "version_skipped" {
		t.Errorf("late v2: %+v, want 200 failed version_skipped", a)
	}
	if a := s.push(t, message(t, orderEvent(agg, 7)), 1); a.code != 200 || a.res.Outcome != model.OutcomeSuccess {
		t.Errorf("v7: %+v", a)
	}
	if applied := appliedVersions(t, s)[agg]; fmt.Sprint(applied) != "[1 3 4 5 6 7]" {
		t.Errorf("applied %v, want [1 3 4 5 6 7]", applied)
	}
}

// A parked event whose handler fails when its turn comes: a transient
// failure leaves it parked (the delivery that opened its turn still
// succeeds) and POST /gaps:check applies it once the fault clears; a
// permanent one records the failure and releases it, so the gap stays at
// its version until it is delivered again.
func TestParkedEventsThatFailWhenTheirTurnComes(t *testing.T) {
	pool := pgtest.Schema(t)
	log := appliedLog(t, pool)
	var mu sync.Mutex
	faults := map[int64]error{}
	h := consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		mu.Lock()
		err := faults[c.Event.Version]
		mu.Unlock()
		if err != nil {
			return err
		}
		return log.Handle(ctx, c)
	})
	setFault := func(v int64, err error) { mu.Lock(); faults[v] = err; mu.Unlock() }
	s := newStackWith(t, pool, projection.Strict(h), "audit-service", nil)
	const agg = "order-f"
	for _, v := range []int64{3, 4, 6} {
		if a := s.push(t, message(t, orderEvent(agg, v)), 1); a.res.Outcome != model.OutcomeParked {
			t.Fatalf("v%d: %+v", v, a)
		}
	}
	setFault(3, errors.New("downstream unavailable"))
	setFault(4, consumer.Permanent("rejected", errors.New("v4 is refused")))
	if a := s.push(t, message(t, orderEvent(agg, 1)), 1); a.res.Outcome != model.OutcomeSuccess {
		t.Fatalf("v1: %+v", a)
	}
	if a := s.push(t, message(t, orderEvent(agg, 2)), 1); a.code != 200 || a.res.Outcome != model.OutcomeSuccess {
		t.Fatalf("v2, whose parked successor fails: %+v, want its own success", a)
	}
	if applied := appliedVersions(t, s)[agg]; fmt.Sprint(applied) != "[1 2]" {
		t.Fatalf("applied %v, want [1 2]", applied)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_attempts WHERE event_id = 'order-f-v3' AND outcome = 'retry'`); n != 1 {
		t.Errorf("%d retry attempts of v3, want 1", n)
	}
	var rep projection.CheckReport
	if s.post(t, "gaps:check", nil, &rep); rep.Applied != 0 {
		t.Errorf("check while the fault lasts applied %d", rep.Applied)
	}
	setFault(3, nil)
	if code := s.post(t, "gaps:check", nil, &rep); code != 200 || rep.Applied != 1 {
		t.Fatalf("check once the fault cleared: %d %+v, want v3 applied (v4 fails for good)", code, rep)
	}
	if applied := appliedVersions(t, s)[agg]; fmt.Sprint(applied) != "[1 2 3]" {
		t.Fatalf("applied %v, want [1 2 3]", applied)
	}
	latest := latestAttempts(s.shipped(t))
	if a := latest["order-f-v4"]; a.Outcome != model.OutcomeFailed || a.ErrorCode != "rejected" {
		t.Errorf("v4's latest attempt %+v, want failed rejected", a)
	}
	if n := s.count(t, `SELECT count(*) FROM relaybus_inbox WHERE event_id = 'order-f-v4'`); n != 0 {
		t.Error("v4 failed for good but its inbox row stayed: a re-push would be taken for a duplicate")
	}
	// Fixed, v4 is delivered again (a re-push): applied, and v6 stays parked behind 5.
	setFault(4, nil)
	if a := s.push(t, message(t, orderEvent(agg, 4)), 2); a.code != 200 || a.res.Outcome != model.OutcomeSuccess {
		t.Fatalf("v4 again: %+v", a)
	}
	if a := s.push(t, message(t, orderEvent(agg, 5)), 1); a.res.Outcome != model.OutcomeSuccess {
		t.Fatalf("v5: %+v", a)
	}
	if applied := appliedVersions(t, s)[agg]; fmt.Sprint(applied) != "[1 2 3 4 5 6]" {
		t.Errorf("applied %v, want [1 2 3 4 5 6]", applied)
	}
	if latest := latestAttempts(s.shipped(t)); !latest["order-f-v3"].Success || !latest["order-f-v6"].Success {
		t.Errorf("ledger: v3 %+v, v6 %+v, want both succeeded", latest["order-f-v3"], latest["order-f-v6"])
	}
}

// Each applied strict delivery writes one version of its aggregate's
// position row: the lock that orders an aggregate's transactions writes
// none, and an aggregate's version 1 creates the row at 1. A version that
// arrives early creates the row at 0 and parks; its predecessor then moves
// the row once for itself and once for each parked version it applies.
// Counted inside each delivery's transaction by Postgres' own counters
// (pg_stat_get_xact_tuples_*, which also hold what earlier transactions of
// the session have not flushed yet: the test takes the difference between
// a reading before the strict handler and one by the handler it runs).
func TestAStrictDeliveryWritesOnePositionVersion(t *testing.T) {
	pool := pgtest.Schema(t)
	log := appliedLog(t, pool)
	type writes struct{ inserted, updated int64 }
	read := func(ctx context.Context, c *consumer.Context) (writes, error) {
		var w writes
		err := c.Tx.QueryRow(ctx, `SELECT pg_stat_get_xact_tuples_inserted(r), pg_stat_get_xact_tuples_updated(r)
			FROM (SELECT 'relaybus_strict_position'::regclass AS r) x`).Scan(&w.inserted, &w.updated)
		return w, err
	}
	var mu sync.Mutex
	var before writes // the delivery's, read before the strict handler (deliveries are pushed one at a time)
	seen := map[int64]writes{}
	res := projection.Strict(consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		w, err := read(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		seen[c.Event.Version] = writes{w.inserted - before.inserted, w.updated - before.updated}
		mu.Unlock()
		return log.Handle(ctx, c)
	}))
	h := consumer.HandlerFunc(func(ctx context.Context, c *consumer.Context) error {
		w, err := read(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		before = w
		mu.Unlock()
		return res.Handle(ctx, c)
	})
	s := newStackWith(t, pool, h, "audit-service", nil)
	const agg = "order-w"
	for _, d := range []struct {
		version int64
		outcome model.Outcome
	}{{1, model.OutcomeSuccess}, {2, model.OutcomeSuccess}, {3, model.OutcomeSuccess}, {5, model.OutcomeParked}, {4, model.OutcomeSuccess}} {
		if a := s.push(t, message(t, orderEvent(agg, d.version)), 1); a.code != 200 || a.res.Outcome != d.outcome {
			t.Fatalf("v%d: %+v, want 200 %s", d.version, a, d.outcome)
		}
	}
	if applied := appliedVersions(t, s)[agg]; fmt.Sprint(applied) != "[1 2 3 4 5]" {
		t.Fatalf("applied %v, want [1 2 3 4 5]", applied)
	}
	// v4 and v5 are applied in one transaction: v5's handler sees both
	// moves.
	want := map[int64]writes{1: {1, 0}, 2: {0, 1}, 3: {0, 1}, 4: {0, 1}, 5: {0, 2}}
	mu.Lock()
	defer mu.Unlock()
	for v, w := range want {
		if seen[v] != w {
			t.Errorf("v%d's transaction wrote %d position rows and %d updates by its handler; want %d and %d",
				v, seen[v].inserted, seen[v].updated, w.inserted, w.updated)
		}
	}
}

// Consumers whose handler keeps no gaps answer 404 on the gap routes.
func TestGapRoutesNeedAStrictHandler(t *testing.T) {
	s := newStack(t, projection.Latest(), "member-service")
	var body map[string]string
	if code := s.post(t, "gaps", nil, &body); code != http.StatusNotFound || body["code"] != "no_gaps" {
		t.Errorf("POST /gaps on a projection consumer: %d %v", code, body)
	}
}

// The success attempts of parked events applied in their predecessor's
// transaction are in Postgres with it; when the ledger is down as they
// commit, the scheduled shipping step (POST /ledger:ship) ships them.
func TestAttemptsOfReleasedEventsAreShippedLaterWhenTheLedgerIsDown(t *testing.T) {
	s := newStack(t, projection.Strict(nil), "audit-service")
	for _, v := range []int64{3, 2} {
		if a := s.push(t, message(t, orderEvent("order-l", v)), 1); a.res.Outcome != model.OutcomeParked {
			t.Fatalf("v%d: %+v", v, a)
		}
	}
	s.shipped(t)
	setFail := func(n int) { s.ledger.mu.Lock(); s.ledger.fail = n; s.ledger.mu.Unlock() }
	setFail(1000) // down for every batch the shipper tries, however it splits them
	if a := s.push(t, message(t, orderEvent("order-l", 1)), 1); a.code != 200 || a.res.Outcome != model.OutcomeSuccess {
		t.Fatalf("v1: %+v", a)
	}
	s.shipped(t)
	setFail(0)
	if n := s.count(t, `SELECT count(*) FROM relaybus_inbox_unshipped q JOIN relaybus_attempts a USING (consumer_id, event_id, attempt_no) WHERE a.outcome = 'success'`); n != 3 {
		t.Fatalf("%d success attempts waiting in Postgres, want 3 (v1 and the two it released)", n)
	}
	_, _ = s.pool.Exec(context.Background(), `UPDATE relaybus_attempts SET consumed_at = consumed_at - interval '1 minute'`)
	var rep consumer.ShipReport
	if code := s.post(t, "ledger:ship", nil, &rep); code != 200 || rep.Shipped != 3 {
		t.Fatalf("POST /ledger:ship: %d %+v, want 3 shipped", code, rep)
	}
	latest := latestAttempts(s.ledger.all())
	for v := 1; v <= 3; v++ {
		if a := latest[fmt.Sprintf("order-l-v%d", v)]; !a.Success {
			t.Errorf("v%d: ledger's latest attempt %+v, want success", v, a)
		}
	}
}
