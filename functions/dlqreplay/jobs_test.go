package dlqreplay_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

// incident is the window the tests' events occurred in.
var incident = time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)

// failedEvent records in the ledger an order event that occurred at at and
// that consumer's attempt ended with outcome (and code); a dead-lettered
// or poison one is archived as a dead letter of that consumer too.
func failedEvent(t *testing.T, e *env, id string, at time.Time, consumer string, outcome model.Outcome, code string) {
	t.Helper()
	ctx := context.Background()
	ev := &event.Event{ID: id, Type: "order.purchased", Source: "order-service", Topic: "shop.order.events", AggregateID: "order-" + id,
		Version: 1, Payload: []byte(`{"orderId":"` + id + `"}`), OccurredAt: at}
	if err := ev.Prepare(at, event.Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := e.store.RecordSent(ctx, model.SentAt(at, ev)); err != nil {
		t.Fatal(err)
	}
	a := model.Attempt{EventID: id, ConsumerID: consumer, AttemptNo: 1, Success: outcome == model.OutcomeSuccess, Outcome: outcome,
		ErrorCode: code, ConsumedAt: at.Add(time.Second), Topic: ev.Topic}
	if _, err := e.store.Fold(ctx, []model.Notice{{EventID: id, Attempts: []model.Attempt{a}}}, 0); err != nil {
		t.Fatal(err)
	}
	if outcome == model.OutcomeDeadLettered || outcome == model.OutcomePoison {
		letterOf(t, e, "dl-"+id, ev, "shop.order.events."+consumer+"-processor")
	}
}

// job drives the job as its caller does (POST /jobs/{id}:run) until it
// ends or another worker holds it, and answers it as the last call did.
func (e *env) job(t *testing.T, id string) map[string]any {
	t.Helper()
	for range 20 {
		a := e.do(t, "POST", "/jobs/"+id+":run", nil)
		if a.status != 200 {
			t.Fatalf("POST /jobs/%s:run: %s", id, a.raw)
		}
		if a.body["state"] != "running" || a.body["busy"] == true {
			return a.body
		}
	}
	t.Fatalf("job %s still runs after 20 slices", id)
	return nil
}

// sends are the job's sends as its document records them, by time.
func (e *env) sends(t *testing.T, id string) []map[string]any {
	t.Helper()
	snaps, err := e.store.Client().Collection(dlqreplay.JobCollection).Doc(id).Collection(dlqreplay.JobSendsCollection).
		OrderBy("at", firestore.Asc).Documents(context.Background()).GetAll()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, s := range snaps {
		out = append(out, s.Data())
	}
	return out
}

// replays counts, per event, the replays its dead letters record.
func (e *env) replays(t *testing.T) map[string]int {
	t.Helper()
	ls, _, err := e.archive.List(context.Background(), archive.Filter{}, 500, "")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, l := range ls {
		out[l.EventID] += len(l.Replays)
	}
	return out
}

func window(extra map[string]any) map[string]any {
	body := map[string]any{"topic": "shop.order.events", "consumer": "member-service", "outcome": "dead_lettered",
		"since": incident.Format(time.RFC3339), "until": incident.Add(40 * time.Minute).Format(time.RFC3339)}
	for k, v := range extra {
		if v == nil {
			delete(body, k)
		} else {
			body[k] = v
		}
	}
	return body
}

// The filter picks the consumer's failures in the window, of the outcome,
// class and code asked, and the dry run counts them without sending; the
// job then sends exactly those, each to the consumer alone (dead letters
// replayed, failures re-pushed through the outbox), audited once.
func TestReplayJobFilterCountsBeforeItSends(t *testing.T) {
	e := newEnv(t, dlqreplay.AuthNone, "")
	in := incident.Add(10 * time.Minute)
	for i := range 3 {
		failedEvent(t, e, fmt.Sprintf("evt-dl-%d", i), in.Add(time.Duration(i)*time.Minute), "member-service", model.OutcomeDeadLettered, "timeout")
	}
	failedEvent(t, e, "evt-poison", in, "member-service", model.OutcomePoison, "malformed")
	failedEvent(t, e, "evt-before", incident.Add(-time.Minute), "member-service", model.OutcomeDeadLettered, "timeout")
	failedEvent(t, e, "evt-after", incident.Add(40*time.Minute), "member-service", model.OutcomeDeadLettered, "timeout")
	failedEvent(t, e, "evt-other", in, "message-service", model.OutcomeDeadLettered, "timeout")
	failedEvent(t, e, "evt-declined", in, "member-service", model.OutcomeFailed, "declined")
	failedEvent(t, e, "evt-ok", in, "member-service", model.OutcomeSuccess, "")

	for _, c := range []struct {
		name  string
		body  map[string]any
		count float64
	}{
		{"dead-lettered", window(nil), 4},
		{"transient only", window(map[string]any{"errorClass": "transient"}), 3},
		{"poison only", window(map[string]any{"errorClass": "poison"}), 1},
		{"one code", window(map[string]any{"errorCode": "malformed"}), 1},
		{"failed", window(map[string]any{"outcome": "failed"}), 1},
		{"failed, permanent", window(map[string]any{"outcome": "failed", "errorClass": "permanent"}), 1},
		{"failed, transient", window(map[string]any{"outcome": "failed", "errorClass": "transient"}), 0},
		{"another consumer", window(map[string]any{"consumer": "message-service"}), 1},
	} {
		c.body["dryRun"] = true
		a := e.do(t, "POST", "/replays", c.body)
		if a.status != 200 || a.body["matched"] != c.count {
			t.Errorf("%s: %d %s, want %v matched", c.name, a.status, a.raw, c.count)
		}
	}
	a := e.do(t, "POST", "/replays", window(map[string]any{"dryRun": true}))
	if sample, _ := a.body["sample"].([]any); len(sample) != 4 || !strings.Contains(a.raw, `"eventId":"evt-dl-0"`) {
		t.Errorf("the dry run's sample: %s", a.raw)
	}
	if r := e.replays(t); len(r) == 0 || r["evt-dl-0"] != 0 {
		t.Fatalf("the dry runs replayed letters: %v", r)
	}
	if a := e.do(t, "GET", "/jobs", nil); a.status != 200 || !strings.Contains(a.raw, `"jobs":[]`) {
		t.Fatalf("a dry run made a job: %s", a.raw)
	}

	// The count confirmed is the count sent.
	if a := e.do(t, "POST", "/replays", window(map[string]any{"errorClass": "transient", "expect": 4})); a.status != 409 || a.body["code"] != "count_changed" {
		t.Fatalf("a job with another count than confirmed: %d %s", a.status, a.raw)
	}
	a = e.do(t, "POST", "/replays", window(map[string]any{"errorClass": "transient", "expect": 3, "rate": 50}))
	if a.status != 200 || a.body["state"] != "running" || a.body["matched"] != float64(3) {
		t.Fatalf("job: %d %s", a.status, a.raw)
	}
	id := a.body["id"].(string)
	j := e.job(t, id)
	if j["state"] != "done" || j["sent"] != float64(3) || j["failed"] != float64(0) || j["remaining"] != float64(0) {
		t.Fatalf("job ended %v", j)
	}
	want := map[string]int{"evt-dl-0": 1, "evt-dl-1": 1, "evt-dl-2": 1}
	for ev, n := range e.replays(t) {
		if n != want[ev] {
			t.Errorf("event %s replayed %d times, want %d", ev, n, want[ev])
		}
	}
	if got := receive(t, e, "shop.order.events.member-service-processor"); len(got) != 3 {
		t.Errorf("member-service received %d messages, want 3", len(got))
	}
	if got := receive(t, e, "shop.order.events.message-service-processor"); len(got) != 0 {
		t.Errorf("message-service received %d messages, want none", len(got))
	}

	// A failure (not dead-lettered) is re-pushed through the outbox, to
	// the consumer alone.
	a = e.do(t, "POST", "/replays", window(map[string]any{"outcome": "failed"}))
	if a.status != 200 {
		t.Fatalf("re-push job: %s", a.raw)
	}
	if j := e.job(t, a.body["id"].(string)); j["state"] != "done" || j["sent"] != float64(1) {
		t.Fatalf("re-push job ended %v", j)
	}
	got, err := outbox.Lookup(context.Background(), e.db, "evt-declined")
	if err != nil || got["evt-declined"].Target != "member-service" {
		t.Fatalf("the re-push is not queued for member-service: %+v %v", got, err)
	}

	// One audit entry starts each job, one says how it ended.
	entries, err := e.store.Audit().List(context.Background(), audit.Query{ActionPrefix: audit.ReplayJob, Limit: 20})
	if err != nil {
		t.Fatal(err)
	}
	started, ended := 0, 0
	for _, x := range entries {
		if x.Action != audit.ReplayJob {
			continue
		}
		switch x.Outcome {
		case audit.OutcomeStarted:
			started++
		case audit.OutcomeSucceeded:
			ended++
			if x.Ref == "" || x.By != "anonymous" {
				t.Errorf("outcome entry %+v: want the started entry's ref and the caller", x)
			}
		}
	}
	if started != 2 || ended != 2 {
		t.Errorf("audit: %d started and %d ended entries, want 2 and 2: %+v", started, ended, entries)
	}
}

// Every field of the filter is checked, each refusal naming its field.
func TestReplayJobFilterIsValidated(t *testing.T) {
	e := newEnv(t, dlqreplay.AuthNone, "")
	for _, c := range []struct {
		body  any
		field string
	}{
		{window(map[string]any{"topic": nil}), "topic"},
		{window(map[string]any{"topic": "Shop.Orders"}), "topic"},
		{window(map[string]any{"topic": "shop.order.events.dlq"}), "topic"},
		{window(map[string]any{"consumer": nil}), "consumer"},
		{window(map[string]any{"consumer": "audit-service"}), "consumer"},
		{window(map[string]any{"since": nil}), "since"},
		{window(map[string]any{"since": "yesterday"}), "since"},
		{window(map[string]any{"until": incident.Add(-time.Hour).Format(time.RFC3339)}), "until"},
		{window(map[string]any{"until": incident.Add(32 * 24 * time.Hour).Format(time.RFC3339)}), "until"},
		{window(map[string]any{"outcome": nil}), "outcome"},
		{window(map[string]any{"outcome": "dead"}), "outcome"},
		{window(map[string]any{"errorClass": "fatal"}), "errorClass"},
		{window(map[string]any{"errorClass": "permanent"}), "errorClass"},
		{window(map[string]any{"outcome": "failed", "errorClass": "poison"}), "errorClass"},
		{window(map[string]any{"errorCode": "a b"}), "errorCode"},
		{window(map[string]any{"rate": 1000}), "rate"},
		{window(map[string]any{"rate": 0}), "rate"},
		{window(map[string]any{"expect": -1}), "expect"},
		{window(map[string]any{"limit": 5}), "limit"},
		{"{", "body"},
	} {
		a := e.do(t, "POST", "/replays", c.body)
		if a.status != 400 || len(a.fields()) != 1 || a.fields()[0] != c.field {
			t.Errorf("%v: %d %s, want 400 naming %s", c.body, a.status, a.raw, c.field)
		}
	}
	for _, c := range []struct{ method, path, field string }{
		{"GET", "/jobs?limit=0", "limit"},
		{"GET", "/jobs?state=lost", "state"},
		{"GET", "/jobs/" + strings.Repeat("j", 65), "id"},
		{"POST", "/jobs/a_b:cancel", "id"},
	} {
		if a := e.do(t, c.method, c.path, nil); a.status != 400 || len(a.fields()) != 1 || a.fields()[0] != c.field {
			t.Errorf("%s %s: %d %s, want 400 naming %s", c.method, c.path, a.status, a.raw, c.field)
		}
	}
	if a := e.do(t, "GET", "/jobs/job-none", nil); a.status != 404 {
		t.Errorf("unknown job: %d %s", a.status, a.raw)
	}
}

// The job sends no more events in any second than its rate, measured on
// the send times it records.
func TestReplayJobRateIsBounded(t *testing.T) {
	e := newEnv(t, dlqreplay.AuthNone, "")
	const n, rate = 15, 10
	for i := range n {
		failedEvent(t, e, fmt.Sprintf("evt-%02d", i), incident.Add(time.Duration(i)*time.Second), "member-service", model.OutcomeDeadLettered, "timeout")
	}
	a := e.do(t, "POST", "/replays", window(map[string]any{"rate": rate}))
	if a.status != 200 {
		t.Fatalf("job: %s", a.raw)
	}
	id := a.body["id"].(string)
	if j := e.job(t, id); j["state"] != "done" || j["sent"] != float64(n) {
		t.Fatalf("job ended %v", j)
	}
	sends := e.sends(t, id)
	if len(sends) != n {
		t.Fatalf("%d sends recorded, want %d", len(sends), n)
	}
	var at []time.Time
	for _, s := range sends {
		at = append(at, s["at"].(time.Time))
	}
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	// rate+1 sends never fall within one second.
	for i := 0; i+rate < len(at); i++ {
		if d := at[i+rate].Sub(at[i]); d < time.Second {
			t.Errorf("sends %d to %d took %s: more than %d in a second", i, i+rate, d, rate)
		}
	}
}

// A cancelled job sends nothing more, and says who cancelled it.
func TestReplayJobCancelStopsIt(t *testing.T) {
	e := newEnv(t, dlqreplay.AuthNone, "")
	const n = 30
	for i := range n {
		failedEvent(t, e, fmt.Sprintf("evt-%02d", i), incident.Add(time.Duration(i)*time.Second), "member-service", model.OutcomeDeadLettered, "timeout")
	}
	a := e.do(t, "POST", "/replays", window(map[string]any{"rate": 2}))
	if a.status != 200 {
		t.Fatalf("job: %s", a.raw)
	}
	id := a.body["id"].(string)
	// Its caller drives it; the operator cancels once it has begun.
	done := make(chan answer, 1)
	go func() { done <- e.do(t, "POST", "/jobs/"+id+":run", nil) }()
	for deadline := time.Now().Add(30 * time.Second); len(e.sends(t, id)) == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if a := e.do(t, "POST", "/jobs/"+id+":cancel", nil); a.status != 200 || a.body["state"] != "cancelled" || a.body["cancelledBy"] != "anonymous" {
		t.Fatalf("cancel: %d %s", a.status, a.raw)
	}
	j := (<-done).body
	sent := int(j["sent"].(float64))
	if j["state"] != "cancelled" || sent >= n/2 {
		t.Fatalf("cancelled job: %v", j)
	}
	// What the job says it sent is what it sent, and no more went out.
	replayed := 0
	for _, c := range e.replays(t) {
		replayed += c
	}
	if replayed != sent || len(e.sends(t, id)) != sent {
		t.Errorf("the job says it sent %d; %d letters were replayed, %d sends recorded", sent, replayed, len(e.sends(t, id)))
	}
	if a := e.do(t, "POST", "/jobs/"+id+":cancel", nil); a.status != 409 || a.body["code"] != "not_running" {
		t.Errorf("second cancel: %d %s", a.status, a.raw)
	}
	if a := e.do(t, "GET", "/jobs?state=cancelled", nil); !strings.Contains(a.raw, id) {
		t.Errorf("GET /jobs?state=cancelled: %s", a.raw)
	}
}

// A job whose worker vanished mid-way is picked up by another instance
// once its lease lapsed, and each event is sent once.
func TestReplayJobResumedAfterItsWorkerStopsSendsEachEventOnce(t *testing.T) {
	e := newEnv(t, dlqreplay.AuthNone, "")
	const n = 12
	for i := range n {
		failedEvent(t, e, fmt.Sprintf("evt-%02d", i), incident.Add(time.Duration(i)*time.Second), "member-service", model.OutcomeDeadLettered, "timeout")
	}
	dlqreplay.StopJobsAfter(e.h, 5)
	a := e.do(t, "POST", "/replays", window(map[string]any{"rate": 100}))
	if a.status != 200 {
		t.Fatalf("job: %s", a.raw)
	}
	id := a.body["id"].(string)
	// The worker stopped dead; its lease holds, so no other may drive
	// the job yet.
	if j := e.job(t, id); j["state"] != "running" || j["busy"] != true {
		t.Fatalf("the stopped worker's job: %v", j)
	}
	if got := len(e.sends(t, id)); got != 5 {
		t.Fatalf("the first worker sent %d, want 5", got)
	}
	// Another instance, once the lease lapsed.
	other := newHandler(t, e, func(*dlqreplay.Options) {})
	dlqreplay.ShiftJobClock(other.h, dlqreplay.JobLease+time.Second)
	j := other.job(t, id)
	if j["state"] != "done" || j["sent"] != float64(n) || j["resumed"] != float64(1) {
		t.Fatalf("the resumed job ended %v", j)
	}
	for ev, c := range e.replays(t) {
		if c != 1 {
			t.Errorf("event %s replayed %d times", ev, c)
		}
	}
	if got := len(e.sends(t, id)); got != n {
		t.Errorf("%d sends recorded, want %d", got, n)
	}
}

// A viewer may count (dry run), not run a job; an operator runs one on
// their scope only.
func TestReplayJobRights(t *testing.T) {
	e := newEnvWith(t, teams)
	failedEvent(t, e, "evt-1", incident.Add(time.Minute), "member-service", model.OutcomeDeadLettered, "timeout")
	for _, c := range []struct {
		who  string
		body map[string]any
		want int
	}{
		{"bob@example.com", window(map[string]any{"dryRun": true}), 200},
		{"bob@example.com", window(nil), 403},
		{"carl@example.com", window(nil), 403},
		{"olga@example.com", window(nil), 200},
	} {
		if a := e.as(t, c.who, "POST", "/replays", c.body); a.status != c.want {
			t.Errorf("%s POST /replays %v: %d %s, want %d", c.who, c.body, a.status, a.raw, c.want)
		}
	}
	a := e.as(t, "bob@example.com", "GET", "/jobs", nil)
	jobs, _ := a.body["jobs"].([]any)
	if a.status != 200 || len(jobs) != 1 {
		t.Fatalf("a viewer lists jobs: %d %s", a.status, a.raw)
	}
	id := jobs[0].(map[string]any)["id"].(string)
	for _, action := range []string{"cancel", "run"} {
		if a := e.as(t, "bob@example.com", "POST", "/jobs/"+id+":"+action, nil); a.status != 403 {
			t.Errorf("a viewer calls :%s: %d %s", action, a.status, a.raw)
		}
		if a := e.as(t, "carl@example.com", "POST", "/jobs/"+id+":"+action, nil); a.status != 403 {
			t.Errorf("an operator of another consumer calls :%s: %d %s", action, a.status, a.raw)
		}
	}
	if a := e.as(t, "olga@example.com", "POST", "/jobs/"+id+":run", nil); a.status != 200 || a.body["state"] != "done" || a.body["sent"] != float64(1) {
		t.Errorf("olga drives her job: %d %s", a.status, a.raw)
	}
}

// The console's replay jobs view in headless Chromium: the count with a
// sample, a job started after a confirmation and driven to its end while
// the view is open, and a running job cancelled.
func TestReplayJobsInTheConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test starts Chromium")
	}
	e := newEnv(t, dlqreplay.AuthNone, "")
	for i := range 3 {
		failedEvent(t, e, fmt.Sprintf("evt-dl-%d", i), incident.Add(time.Duration(i+1)*time.Minute), "member-service", model.OutcomeDeadLettered, "timeout")
	}
	failedEvent(t, e, "evt-other", incident.Add(time.Minute), "message-service", model.OutcomeDeadLettered, "timeout")
	b := newBrowser(t, e.url+"/console/")
	b.open("/jobs?topic=shop.order.events&consumer=member-service&since=2026-11-20T10:00:00Z&until=2026-11-20T10:40:00Z&outcome=dead_lettered")
	b.waitFor("the count", `(document.querySelector("[data-testid=job-matched]")?.textContent || "").startsWith("3 event(s) match")`, 20*time.Second)
	if n := b.count("[data-testid=job-sample]"); n != 3 {
		t.Errorf("%d sample rows, want 3", n)
	}
	if n := b.count("[data-testid=job-row]"); n != 0 {
		t.Errorf("the count made %d job(s)", n)
	}
	b.click("[data-testid=job-start]")
	b.waitFor("the confirmation", `document.getElementById("confirm").open`, 10*time.Second)
	b.click("#confirm-ok")
	b.waitFor("the job done", `(() => { const r = document.querySelector("[data-testid=job-row]");
		return !!r && r.querySelector("[data-testid=job-state]").textContent === "done" && r.querySelector("[data-testid=job-sent]").textContent === "3/3" })()`, 30*time.Second)
	if r := e.replays(t); r["evt-dl-0"] != 1 || r["evt-dl-2"] != 1 || r["evt-other"] != 0 {
		t.Errorf("replays %v: want each of member-service's letters once, message-service's none", r)
	}
	b.shot("replay-jobs")

	// A slow job, cancelled from its row.
	if status := b.fetch("POST", "/replays", window(map[string]any{"rate": 0.5})); status != 200 {
		t.Fatalf("second job: %d", status)
	}
	b.waitFor("the running job's cancel button", `!!document.querySelector("[data-testid=job-cancel]")`, 20*time.Second)
	b.click("[data-testid=job-cancel]")
	b.waitFor("the confirmation", `document.getElementById("confirm").open`, 10*time.Second)
	b.click("#confirm-ok")
	b.waitFor("the job cancelled", `[...document.querySelectorAll("[data-testid=job-state]")].some((s) => s.textContent === "cancelled")`, 20*time.Second)
	a := e.do(t, "GET", "/jobs?state=cancelled", nil)
	jobs, _ := a.body["jobs"].([]any)
	if len(jobs) != 1 || jobs[0].(map[string]any)["sent"].(float64) >= 3 {
		t.Errorf("the cancelled job: %s", a.raw)
	}
}

// A slice that ends releases the job: the next :run (any caller's) goes on
// at once from where it stopped, without a takeover.
func TestReplayJobSlicesHandOver(t *testing.T) {
	e := newEnv(t, dlqreplay.AuthNone, "")
	const n = 8
	for i := range n {
		failedEvent(t, e, fmt.Sprintf("evt-%02d", i), incident.Add(time.Duration(i)*time.Second), "member-service", model.OutcomeDeadLettered, "timeout")
	}
	a := e.do(t, "POST", "/replays", window(map[string]any{"rate": 4}))
	if a.status != 200 {
		t.Fatalf("job: %s", a.raw)
	}
	id := a.body["id"].(string)
	a = e.do(t, "POST", "/jobs/"+id+":run", map[string]any{"seconds": 1})
	if a.status != 200 || a.body["state"] != "running" || a.body["busy"] != nil || a.body["sent"].(float64) >= n {
		t.Fatalf("a 1 s slice at 4/s: %d %s", a.status, a.raw)
	}
	if a := e.do(t, "POST", "/jobs/"+id+":run", map[string]any{"seconds": 241}); a.status != 400 || a.fields()[0] != "seconds" {
		t.Errorf("a 241 s slice: %d %s", a.status, a.raw)
	}
	j := e.job(t, id)
	if j["state"] != "done" || j["sent"] != float64(n) || j["resumed"] != float64(0) {
		t.Fatalf("the job after its slices: %v", j)
	}
	if got := len(e.sends(t, id)); got != n {
		t.Errorf("%d sends recorded, want %d", got, n)
	}
}
