package dlqreplay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/browsertest"
	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/devstack"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/event"
)

// browser is a headless Chromium tab on a console.
type browser struct {
	t       *testing.T
	ctx     context.Context
	console string // the console's URL
	shots   string
	n       atomic.Int64
}

func newBrowser(t *testing.T, console string) *browser {
	t.Helper()
	// A fresh profile, removed once Chromium's helper processes let go of
	// it (they may still write in it while the browser exits, which a
	// t.TempDir's strict cleanup would fail the test over).
	profile, err := os.MkdirTemp("", "relaybus-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 20 {
			if os.RemoveAll(profile) == nil {
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
		t.Logf("left Chromium's profile %s behind", profile)
	})
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(browsertest.Chromium(t)),
		chromedp.Flag("headless", true), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		// Without these Chromium stalls on a closed network, reaching for
		// Google's services.
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		// /dev/shm is 64 MB in a container (Cloud Build's steps, Docker's
		// default): Chromium's renderer crashes or hangs on a larger page
		// there; this makes it use /tmp instead.
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(profile), chromedp.WindowSize(1400, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	// chromedp v0.14's protocol tables predate some of Chromium's events
	// (the top layer a <dialog> opens in): it logs them as unhandled.
	quiet := func(format string, args ...any) {
		if msg := fmt.Sprintf(format, args...); !strings.Contains(msg, "unhandled") {
			t.Log("chromedp: " + msg)
		}
	}
	ctx, cancelTab := chromedp.NewContext(actx, chromedp.WithErrorf(quiet))
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx) // closes the browser and waits for it
		cancelTab()
		cancelAlloc()
	})
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	return &browser{t: t, ctx: ctx, console: console, shots: browsertest.Screenshots(t)}
}

// run runs actions with a deadline; a failure fails the test with a
// screenshot of the page as it was.
func (b *browser) run(what string, timeout time.Duration, actions ...chromedp.Action) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	if err := chromedp.Run(ctx, actions...); err != nil {
		var png []byte
		_ = chromedp.Run(b.ctx, chromedp.FullScreenshot(&png, 100))
		path := filepath.Join(b.t.TempDir(), "failure.png")
		_ = os.WriteFile(path, png, 0o644)
		var text string
		_ = chromedp.Run(b.ctx, chromedp.Text("body", &text, chromedp.ByQuery))
		b.t.Fatalf("%s: %v\nthe page (screenshot %s) says:\n%s", what, err, path, clipText(text))
	}
}

func clipText(s string) string {
	if len(s) > 2000 {
		return s[:2000] + "…"
	}
	return s
}

// open loads a console page (a fresh load, not a hash change).
func (b *browser) open(hash string) {
	b.t.Helper()
	url := fmt.Sprintf("%s?load=%d#%s", b.console, b.n.Add(1), hash)
	b.run("open "+hash, 20*time.Second, chromedp.Navigate(url), chromedp.WaitReady("#main", chromedp.ByQuery))
}

// waitFor polls a JavaScript condition until it holds.
func (b *browser) waitFor(what, js string, timeout time.Duration) {
	b.t.Helper()
	var ok bool
	b.run("wait until "+what, timeout, chromedp.Poll(js, &ok, chromedp.WithPollingInterval(200*time.Millisecond)))
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	var s string
	b.run("read "+sel, 10*time.Second, chromedp.Text(sel, &s, chromedp.ByQuery, chromedp.NodeVisible))
	return strings.TrimSpace(s)
}

func (b *browser) click(sel string) {
	b.t.Helper()
	b.run("click "+sel, 10*time.Second, chromedp.Click(sel, chromedp.ByQuery, chromedp.NodeVisible))
}

// count counts the elements a selector matches.
func (b *browser) count(sel string) int {
	b.t.Helper()
	var n int
	b.run("count "+sel, 10*time.Second, chromedp.Evaluate(fmt.Sprintf("document.querySelectorAll(%q).length", sel), &n))
	return n
}

// fetch calls the API from the page (same origin, as the console does) and
// returns the status.
func (b *browser) fetch(method, path string, body any) int {
	b.t.Helper()
	js, _ := json.Marshal(body)
	var status int
	b.run("fetch "+path, 10*time.Second, chromedp.Evaluate(fmt.Sprintf(
		`fetch(location.pathname.replace(/\/console\/.*$/, "") + %q, {method: %q, headers: {"Content-Type": "application/json"}, body: %q}).then(r => r.status)`,
		path, method, string(js)), &status, func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }))
	return status
}

// shot saves a full-page screenshot as <name>.png.
func (b *browser) shot(name string) {
	b.t.Helper()
	var png []byte
	b.run("screenshot "+name, 20*time.Second, chromedp.Sleep(300*time.Millisecond), chromedp.FullScreenshot(&png, 100))
	if err := os.WriteFile(filepath.Join(b.shots, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// publish POSTs an order to the stack's publish function, as a producer
// would, and returns its event id.
func publishOrder(t *testing.T, base, orderID string, extra map[string]any) string {
	t.Helper()
	payload := map[string]any{"orderId": orderID, "memberId": "m-" + orderID, "amount": 42}
	for k, v := range extra {
		payload[k] = v
	}
	body, _ := json.Marshal(map[string]any{"eventType": "order.purchased", "topic": "shop.order.events", "aggregateId": orderID,
		"version": 1, "source": "order-service", "payload": payload, "initiator": map[string]any{"service": "web", "operation": "checkout"}})
	resp, err := http.Post(base+"/publish", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ EventID string }
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != http.StatusAccepted || out.EventID == "" {
		t.Fatalf("publish %s: %d", orderID, resp.StatusCode)
	}
	return out.EventID
}

// The console in headless Chromium against the real local stack (Postgres,
// the Firestore emulator, pstest, every function and the delivery loop), as
// an operator uses it. Each step asserts what the page shows; the
// screenshots are docs/operations.md's (make screenshots).
func TestConsoleInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test starts the whole stack and Chromium")
	}
	ctx := context.Background()
	_, schema := pgtest.SchemaConfig(t, nil)
	stack, err := devstack.Start(ctx, devstack.Options{
		Addr: "127.0.0.1:0", StateDir: t.TempDir(), Project: emutest.FirestoreProject(t),
		DatabaseURL: pgtest.SchemaURL(t, schema), FirestoreHost: emutest.Host(t, emulator.Firestore), RelayEvery: 500 * time.Millisecond,
		// The console's dead letters come from max delivery attempts: the
		// topology's backoff (10 s doubling) ×0.05, as make dev once did.
		BackoffScale: 0.05,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		stack.Close(cctx)
	})
	base := stack.Info.URL
	// The stack's unknown paths answer JSON, as its functions do.
	if resp, err := http.Get(base + "/consume/shop.order.events.nobody-processor"); err != nil || resp.StatusCode != 404 ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Errorf("unknown /consume path: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	b := newBrowser(t, base+"/dlqreplay/console/")
	run := event.NewID()[:8]

	// 1. An order published by a producer reaches CONSUMED in the list.
	order := "order-" + run
	id := publishOrder(t, base, order, nil)
	b.open("/events?aggregateId=" + order)
	row := fmt.Sprintf("[data-testid=event-row][data-event-id=%q]", id)
	b.waitFor("the order is CONSUMED in the list", fmt.Sprintf(
		`(() => { const r = document.querySelector(%q); return !!r && r.querySelector("[data-testid=status]").textContent === "CONSUMED" })()`, row), 60*time.Second)
	if got := b.text(row + " [data-testid=consumed]"); got != "2/2 consumed" {
		t.Errorf("the row says %q, want 2/2 consumed", got)
	}
	b.open("/events")
	b.waitFor("the list", `document.querySelectorAll("[data-testid=event-row]").length >= 3`, 30*time.Second)
	b.shot("events")

	// The event: its envelope, payload, fate and attempts.
	b.open("/events/" + id)
	b.waitFor("the event page", `document.querySelector("[data-testid=summary]")?.textContent === "2/2 consumed"`, 20*time.Second)
	if got := b.text("[data-testid=payload]"); !strings.Contains(got, `"orderId": "`+order+`"`) {
		t.Errorf("payload shown as %q, want pretty JSON", got)
	}
	if n := b.count("[data-testid=fate-row]"); n != 2 {
		t.Errorf("%d consumers in the fate matrix, want 2", n)
	}
	if n := b.count("[data-testid=child]"); n != 2 {
		t.Errorf("%d children, want points.added and notification.sent", n)
	}
	if n := b.count("[data-testid=cloud-trace]"); n != 0 {
		t.Error("the local stack (no Cloud Trace) links the trace to Cloud Trace")
	}
	b.shot("event")

	// 2. Its trace: the order and its two children, each CONSUMED.
	b.click("[data-testid=open-trace]")
	b.waitFor("the trace tree", `document.querySelectorAll("[data-testid=trace-node]").length === 3`, 20*time.Second)
	if got := b.text(fmt.Sprintf("[data-testid=trace-node][data-event-id=%q] > .node", id)); !strings.Contains(got, "order.purchased") || !strings.Contains(got, "CONSUMED") || !strings.Contains(got, "published →") {
		t.Errorf("the root node says %q", got)
	}
	if n := b.count("[data-testid=trace-node] [data-testid=trace-node] [data-testid=status]"); n != 2 {
		t.Errorf("%d children under the order in the tree, want 2", n)
	}
	b.shot("trace")

	// The overview, live, and paused.
	b.open("/")
	b.waitFor("the overview counts", `Number(document.querySelector("[data-testid=count-CONSUMED] .n")?.textContent) >= 3`, 20*time.Second)
	b.waitFor("the lag table", `document.querySelectorAll("[data-testid=hop]").length === 4`, 10*time.Second)
	b.click("[data-testid=live-toggle]")
	if got := b.text("[data-testid=live-state]"); got != "Paused" {
		t.Errorf("after Pause the overview says %q", got)
	}
	b.click("[data-testid=live-toggle]")

	// 3. A dead letter: message-service fails its first 5 attempts, Pub/Sub
	// dead-letters it; filter, dry-run, replay to it alone, see the attempt.
	failing := "order-dl-" + run
	dlEvent := publishOrder(t, base, failing, map[string]any{"failNotifyAttempts": 5})
	b.open("/deadletters")
	b.run("filter the dead letters", 10*time.Second,
		chromedp.SetValue("[data-testid=filter-consumer]", "message-service", chromedp.ByQuery),
		chromedp.SetValue("[data-testid=filter-reason]", "max_delivery_attempts", chromedp.ByQuery),
		chromedp.SetValue("[data-testid=filter-eventId]", dlEvent, chromedp.ByQuery),
		chromedp.Click("[data-testid=apply]", chromedp.ByQuery))
	var letterID string
	eventually.Within(90*time.Second, func() bool {
		b.waitFor("the filtered list", `!!document.querySelector("[data-testid=letter-row], [data-testid=no-letters]")`, 20*time.Second)
		b.run("read the letter", 5*time.Second, chromedp.Evaluate(`document.querySelector("[data-testid=letter-row]")?.dataset.letterId || ""`, &letterID))
		if letterID == "" {
			b.run("reload", 10*time.Second, chromedp.Reload())
		}
		return letterID != ""
	})
	if letterID == "" {
		t.Fatal("message-service's dead letter never showed in the filtered list")
	}
	if !strings.Contains(b.text("[data-testid=letters]"), "message-service") {
		t.Error("the filtered list does not name message-service")
	}
	b.shot("dead-letters")
	b.click(fmt.Sprintf("[data-testid=letter-row][data-letter-id=%q] a", letterID))
	b.waitFor("the letter page", `!!document.querySelector("[data-testid=dry-run]")`, 20*time.Second)
	b.click("[data-testid=dry-run]")
	b.waitFor("the dry run", `!!document.querySelector("[data-testid=plan-outcome]")`, 20*time.Second)
	if got := b.text("[data-testid=plan-outcome]"); got != "deliver" {
		t.Errorf("dry run outcome %q, want deliver", got)
	}
	if got := b.text("[data-testid=plan-view]"); !strings.Contains(got, "message-service alone will receive event "+dlEvent) || !strings.Contains(got, "has not applied event") {
		t.Errorf("the dry run says %q", got)
	}
	b.shot("dead-letter")
	b.click("[data-testid=replay]")
	b.waitFor("the confirmation", `document.getElementById("confirm").open`, 10*time.Second)
	b.click("#confirm-ok")
	b.waitFor("the replay's notice", `/Replayed to message-service/.test(document.querySelector("[data-testid=notice]")?.textContent || "")`, 20*time.Second)
	b.open("/events/" + dlEvent)
	b.waitFor("the replay's attempt", `[...document.querySelectorAll("[data-testid=attempt][data-consumer=message-service]")].some(r => Number(r.dataset.attempt) > 5 && r.textContent.includes("success"))`, 60*time.Second)
	b.waitFor("the event CONSUMED", `document.querySelector("[data-testid=summary]")?.textContent === "2/2 consumed"`, 30*time.Second)

	// 4. Bulk replay by filter: the count, a confirmation, the replays.
	for i := range 2 {
		poison := event.Message{Data: []byte(`{"note":"no aggregate id"}`),
			Attributes: map[string]string{"event_id": fmt.Sprintf("poison-%s-%d", run, i), "event_type": "order.purchased"}}
		if _, err := stack.PubSub.Publish(ctx, "shop.order.events", poison); err != nil {
			t.Fatal(err)
		}
	}
	b.open("/deadletters?consumer=member-service&reason=missing_aggregate_id")
	b.waitFor("two poison letters of member-service", `document.querySelectorAll("[data-testid=letter-row]").length === 2`, 60*time.Second)
	b.click("[data-testid=bulk-replay]")
	b.waitFor("the bulk confirmation", `document.getElementById("confirm").open`, 20*time.Second)
	if got := b.text("[data-testid=bulk-count]"); !strings.HasPrefix(got, "2 dead letter(s) match") {
		t.Errorf("the confirmation says %q", got)
	}
	b.shot("bulk-replay")
	b.click("#confirm-ok")
	b.waitFor("the bulk notice", `/Replayed 2 of 2/.test(document.querySelector("[data-testid=bulk-result]")?.textContent || "")`, 30*time.Second)
	b.waitFor("each letter replayed once", `[...document.querySelectorAll("[data-testid=letter-row] [data-testid=replays]")].filter(c => c.textContent === "1").length === 2`, 30*time.Second)

	// 5. Disable message-service on the order topic: the next order expects
	// member-service alone.
	b.open("/consumers")
	msgRow := `[data-testid=topic][data-topic="shop.order.events"] [data-testid=consumer-row][data-consumer=message-service]`
	b.waitFor("the registry", fmt.Sprintf(`!!document.querySelector(%q)`, msgRow+" [data-testid=disable]"), 20*time.Second)
	b.click(msgRow + " [data-testid=disable]")
	b.waitFor("the confirmation", `document.getElementById("confirm").open`, 10*time.Second)
	b.click("#confirm-ok")
	b.waitFor("message-service disabled", fmt.Sprintf(`document.querySelector(%q)?.textContent.startsWith("disabled")`, msgRow+" [data-testid=consumer-state]"), 20*time.Second)
	if got := b.text("[data-testid=audit-row]"); !strings.Contains(got, "consumer.disable") || !strings.Contains(got, "message-service") || !strings.Contains(got, "anonymous") {
		t.Errorf("the audit row says %q", got)
	}
	// The disabled entry is now the operator's: the deploy's sync leaves it
	// (the rule is on the page); the others still follow the topology.
	if got := b.text(msgRow + " [data-testid=consumer-owner]"); got != "operator's" {
		t.Errorf("message-service's owner tag says %q, want operator's", got)
	}
	memberRow := `[data-testid=topic][data-topic="shop.order.events"] [data-testid=consumer-row][data-consumer=member-service]`
	if got := b.text(memberRow + " [data-testid=consumer-owner]"); got != "topology's" {
		t.Errorf("member-service's owner tag says %q, want topology's", got)
	}
	if got := b.text("[data-testid=ownership]"); !strings.Contains(got, "never rewrites nor disables an entry an operator added or changed") {
		t.Errorf("the registry page states no ownership rule: %q", got)
	}
	b.shot("consumers")
	// The services cache the registry (registry.DefaultCacheTTL): publish
	// until an order is sent under the change.
	deadline := time.Now().Add(90 * time.Second)
	expects := ""
	for i := 0; time.Now().Before(deadline); i++ { // an order per try, 3 s apart: not a poll
		next := publishOrder(t, base, fmt.Sprintf("order-after-%s-%d", run, i), nil)
		b.open("/events/" + next)
		b.waitFor("the new order's page", `/^\d+\/\d+ consumed$/.test(document.querySelector("[data-testid=summary]")?.textContent || "")`, 30*time.Second)
		if expects = b.text("[data-testid=summary]"); strings.HasSuffix(expects, "/1 consumed") {
			break
		}
		time.Sleep(3 * time.Second)
	}
	if !strings.HasSuffix(expects, "/1 consumed") {
		t.Fatalf("orders sent after the disable still expect two consumers (%q)", expects)
	}
	b.open("/consumers")
	b.waitFor("the enable button", fmt.Sprintf(`!!document.querySelector(%q)`, msgRow+" [data-testid=enable]"), 20*time.Second)
	b.click(msgRow + " [data-testid=enable]")
	b.waitFor("message-service enabled again", fmt.Sprintf(`document.querySelector(%q)?.textContent.startsWith("enabled")`, msgRow+" [data-testid=consumer-state]"), 20*time.Second)

	// Pause a push consumer from its row (on the local stack the delivery
	// loop holds its messages), see it paused, resume it. An Eventarc
	// consumer offers no pause.
	auditRow := `[data-testid=topic][data-topic="member.points.events"] [data-testid=consumer-row][data-consumer=audit-service]`
	b.waitFor("the pause button", fmt.Sprintf(`!!document.querySelector(%q)`, auditRow+" [data-testid=pause]"), 20*time.Second)
	if n := b.count(msgRow + " [data-testid=pause]"); n != 0 {
		t.Error("the Eventarc consumer offers a pause")
	}
	b.click(auditRow + " [data-testid=pause]")
	b.waitFor("the pause confirmation", `document.getElementById("confirm").open`, 10*time.Second)
	b.click("#confirm-ok")
	b.waitFor("audit-service paused", fmt.Sprintf(`/paused/.test(document.querySelector(%q)?.textContent || "") && !!document.querySelector(%q)`,
		auditRow+" [data-testid=consumer-state]", auditRow+" [data-testid=resume]"), 20*time.Second)
	if got := b.text("[data-testid=audit-row]"); !strings.Contains(got, "consumer.pause") {
		t.Errorf("the newest audit row says %q, want the pause", got)
	}
	b.shot("consumer-paused")
	b.click(auditRow + " [data-testid=resume]")
	b.waitFor("audit-service resumed", fmt.Sprintf(`!!document.querySelector(%q) && !/paused/.test(document.querySelector(%q)?.textContent || "")`,
		auditRow+" [data-testid=pause]", auditRow+" [data-testid=consumer-state]"), 20*time.Second)

	// 6. A strict consumer's gap: audit-service records notifications in
	// order; version 2 of a notification whose version 1 never comes parks
	// behind a gap. The operator finds it from the registry, skips version
	// 1 with a reason, and the consumer's next gap check applies version 2.
	gapID := "gap-" + run
	gapEvent := &event.Event{ID: "evt-" + gapID, Type: "notification.sent", Source: "message-service", Topic: "message.notification.events",
		AggregateType: "notification", AggregateID: gapID, Version: 2, Payload: []byte(`{"memberId":"m-gap","channel":"email"}`)}
	if err := gapEvent.Prepare(time.Now(), event.Limits{}); err != nil {
		t.Fatal(err)
	}
	gapMsg, err := cloudevent.Encode(gapEvent, event.EncodingProtobuf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stack.PubSub.Publish(ctx, "message.notification.events", gapMsg); err != nil {
		t.Fatal(err)
	}
	strictRow := `[data-testid=topic][data-topic="message.notification.events"] [data-testid=consumer-row][data-consumer=audit-service]`
	b.open("/consumers")
	b.waitFor("the gaps link", fmt.Sprintf(`!!document.querySelector(%q)`, strictRow+" [data-testid=gaps-link]"), 20*time.Second)
	if n := b.count(memberRow + " [data-testid=gaps-link], " + memberRow + " [data-testid=rebuild-link]"); n != 0 {
		t.Errorf("member-service (its own handler) offers %d gap or rebuild links", n)
	}
	b.click(strictRow + " [data-testid=gaps-link]")
	gapRow := fmt.Sprintf("[data-testid=gap-row][data-aggregate-id=%q]", gapID)
	b.waitFor("the parked notification's gap", fmt.Sprintf(`!!document.querySelector(%q)`, gapRow), 60*time.Second)
	if got := b.text(gapRow + " [data-testid=gap-missing]"); got != "1" {
		t.Errorf("the gap row says version %q is missing, want 1", got)
	}
	b.shot("gaps")
	b.click(gapRow + " [data-testid=skip]")
	b.waitFor("the skip confirmation", `document.getElementById("confirm").open`, 10*time.Second)
	b.run("give a reason", 10*time.Second, chromedp.SendKeys("[data-testid=skip-reason]", "version 1 was never published (INC-7)", chromedp.ByQuery))
	b.click("#confirm-ok")
	b.waitFor("the skip's notice", `/Skipped .* version\(s\) 1\./.test(document.querySelector("[data-testid=gap-result]")?.textContent || "")`, 20*time.Second)
	b.waitFor("the gap gone once the check applied version 2", fmt.Sprintf(`!document.querySelector(%q) && !!document.querySelector("[data-testid=gaps] table, [data-testid=no-gaps]")`, gapRow), 60*time.Second)

	// 7. Rebuild audit-service's projection of member points: a dry run
	// counts what would be cleared; the run pauses, seeks, clears and
	// resumes. The local Pub/Sub cannot seek back over messages
	// (pstestserver refuses it: pstest would put them back without their
	// content), so the seek goes to the next whole second, after the last
	// event of audit-service's two topics (points, notifications; the form
	// takes seconds): nothing is replayed and the projection is left
	// empty, which the dry run after the run shows.
	b.open("/consumers")
	pointsRow := `[data-testid=topic][data-topic="member.points.events"] [data-testid=consumer-row][data-consumer=audit-service]`
	b.waitFor("the rebuild link", fmt.Sprintf(`!!document.querySelector(%q)`, pointsRow+" [data-testid=rebuild-link]"), 20*time.Second)
	if entries, err := stack.Ledger.Audit().List(ctx, audit.Query{ActionPrefix: "gaps.", Outcome: audit.OutcomeSucceeded, Limit: 10}); err != nil || len(entries) != 1 ||
		entries[0].ConsumerID != "audit-service" || !strings.Contains(entries[0].Detail, "INC-7") {
		t.Errorf("the audit log holds %+v (%v), want the skip and its reason", entries, err)
	}
	b.click(pointsRow + " [data-testid=rebuild-link]")
	b.waitFor("the rebuild form", `!!document.querySelector("[data-testid=rebuild-dry-run]")`, 20*time.Second)
	at := time.Now().Add(time.Second).Truncate(time.Second)
	time.Sleep(time.Until(at) + 100*time.Millisecond) // a time in the future is refused
	seekTo := at.UTC().Format("2006-01-02T15:04:05")
	b.run("set the seek time", 10*time.Second, chromedp.SetValue("[data-testid=rebuild-time]", seekTo, chromedp.ByQuery),
		chromedp.Click("[data-testid=rebuild-dry-run]", chromedp.ByQuery))
	b.waitFor("the dry run's plan", `!!document.querySelector("[data-testid=would-clear]")`, 20*time.Second)
	if got := b.text("[data-testid=would-clear]"); !strings.Contains(got, "projection row(s)") || strings.HasPrefix(got, "0 projection") {
		t.Errorf("the dry run would clear %q, want audit-service's points projection", got)
	}
	b.shot("rebuild")
	b.click("[data-testid=rebuild-run]")
	b.waitFor("the rebuild confirmation", `document.getElementById("confirm").open && !!document.querySelector("#confirm [data-testid=rebuild-plan-view]")`, 20*time.Second)
	b.click("#confirm-ok")
	b.waitFor("the rebuild's notice", `/Rebuilt audit-service .* and resumed\./.test(document.querySelector("[data-testid=rebuild-result]")?.textContent || "")`, 30*time.Second)
	b.click("[data-testid=rebuild-dry-run]")
	b.waitFor("nothing left to clear", `/^0 projection row\(s\), 0 inbox/.test(document.querySelector("[data-testid=would-clear]")?.textContent || "")`, 20*time.Second)
	b.open("/consumers")
	b.waitFor("the rebuild in the audit log", `/consumer\.rebuild/.test(document.querySelector("[data-testid=audit-row]")?.textContent || "")`, 20*time.Second)

	// The overview after all this: counts, dead letters, lag.
	b.open("/")
	b.waitFor("the overview's dead letters", `/Dead letters \(\d+\)/.test(document.querySelector("[data-testid=dead-letter-summary]")?.textContent || "")`, 20*time.Second)
	b.waitFor("the lag table", `document.querySelectorAll("[data-testid=hop]").length === 4`, 10*time.Second)
	b.shot("overview")

	// 8. Read-only: the same stack through a read-only API; write actions
	// are not shown, and the API refuses them.
	// Built as the stack built its own dlqreplay, read-only.
	rc := instance.Defaults[dlqreplay.Config]()
	rc.ProjectID, rc.LogHandler = stack.Info.Project, slog.DiscardHandler
	rc.PubSub.EmulatorHost, rc.Ledger.EmulatorHost = stack.Info.PubSubHost, stack.Info.FirestoreHost
	rc.DB.URL, rc.DatabaseURLs = stack.Info.DatabaseURL, stack.Info.Databases
	rc.Auth, rc.ReadOnly, rc.Writers = dlqreplay.AuthNone, true, []string{dlqreplay.Anonymous}
	rc.TraceProject = "relaybus-prod" // as production's own project is
	b.console = serveConsole(t, rc)
	b.open("/deadletters/" + letterID)
	b.waitFor("the read-only letter page", `!!document.querySelector("[data-testid=dry-run]") && !!document.querySelector("[data-testid=read-only-banner]")`, 20*time.Second)
	for _, sel := range []string{"[data-testid=replay]", "[data-testid=delete]"} {
		if n := b.count(sel); n != 0 {
			t.Errorf("read-only page shows %s", sel)
		}
	}
	if b.count("[data-testid=read-only]") != 1 || !strings.Contains(b.text("[data-testid=read-only-banner]"), "Read-only") {
		t.Error("the page does not say it is read-only")
	}
	b.click("[data-testid=dry-run]")
	b.waitFor("a dry run is a read", `!!document.querySelector("[data-testid=plan-outcome]")`, 20*time.Second)
	if status := b.fetch("POST", "/deadletters/"+letterID+":replay", map[string]any{}); status != http.StatusForbidden {
		t.Errorf("a replay through the read-only API answered %d, want 403", status)
	}
	if status := b.fetch("POST", "/consumers/shop.order.events/message-service:disable", nil); status != http.StatusForbidden {
		t.Errorf("a registry change through the read-only API answered %d, want 403", status)
	}
	b.shot("read-only")
	b.open("/consumers")
	b.waitFor("the read-only registry", `document.querySelectorAll("[data-testid=consumer-row]").length >= 4`, 20*time.Second)
	if n := b.count("[data-testid=disable], [data-testid=enable], [data-testid=describe], [data-testid=add-consumer]"); n != 0 {
		t.Errorf("the read-only registry shows %d write controls", n)
	}
	b.open("/events/" + id)
	b.waitFor("the read-only event page", `!!document.querySelector("[data-testid=repush-rules]")`, 20*time.Second)
	if n := b.count("[data-testid=repush-button]"); n != 0 {
		t.Error("the read-only event page offers a re-push")
	}
	// With a project, the event's trace id links to Cloud Trace.
	var traceID, href string
	b.run("read the trace link", 10*time.Second,
		chromedp.Evaluate(`document.querySelector("[data-testid=cloud-trace]")?.href || ""`, &href),
		chromedp.Evaluate(`[...document.querySelectorAll("table.kv th")].find(th => th.textContent === "Trace")?.nextSibling.querySelector("a.mono")?.textContent || ""`, &traceID))
	if want := "https://console.cloud.google.com/traces/list?project=relaybus-prod&tid=" + traceID; traceID == "" || href != want {
		t.Errorf("the Cloud Trace link is %q, want %q", href, want)
	}
	// The gaps and the rebuild's dry run are reads; their writes are hidden.
	b.open("/consumers/message.notification.events/audit-service/gaps")
	b.waitFor("the read-only gaps", `!!document.querySelector("[data-testid=gaps] table, [data-testid=no-gaps]")`, 20*time.Second)
	b.open("/consumers/member.points.events/audit-service/rebuild")
	b.waitFor("the read-only rebuild form", `!!document.querySelector("[data-testid=rebuild-dry-run]")`, 20*time.Second)
	if n := b.count("[data-testid=skip], [data-testid=rebuild-run]"); n != 0 {
		t.Errorf("the read-only console shows %d skip or rebuild buttons", n)
	}
	if status := b.fetch("POST", "/consumers/member.points.events/audit-service:rebuild", map[string]any{"time": time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)}); status != http.StatusForbidden {
		t.Errorf("a rebuild through the read-only API answered %d, want 403", status)
	}
	if status := b.fetch("POST", "/consumers/message.notification.events/audit-service/gaps:skip", map[string]any{"aggregateId": "x", "version": 1}); status != http.StatusForbidden {
		t.Errorf("a gap skip through the read-only API answered %d, want 403", status)
	}

	// 9. Operator rights per team: the caller operates audit-service only
	// (on every topic it consumes) and views the rest. The console shows
	// the controls its roles allow and hides the others, and the API
	// refuses what the console hides, naming the missing right.
	sc := rc
	sc.ReadOnly, sc.Writers = false, nil
	sc.Roles = `[{"member": "anonymous", "role": "viewer"}, {"member": "anonymous", "role": "operator", "consumers": ["audit-service"]}]`
	b.console = serveConsole(t, sc)
	b.open("/consumers")
	b.waitFor("the scoped registry", `document.querySelectorAll("[data-testid=consumer-row]").length >= 4 && !!document.querySelector("[data-testid=caller]")`, 20*time.Second)
	if got := b.text("#who"); !strings.Contains(got, "operator of audit-service") || strings.Contains(got, "read-only") || b.count("[data-testid=role]") != 2 {
		t.Errorf("the header says %q, want the caller's two roles", got)
	}
	controls := func(topic, consumer string) int {
		var n int
		b.run("count the controls of "+consumer, 5*time.Second, chromedp.Evaluate(fmt.Sprintf(
			`document.querySelectorAll('[data-testid=topic][data-topic=%q] [data-testid=consumer-row][data-consumer=%q] button').length`, topic, consumer), &n))
		return n
	}
	if n := controls("shop.order.events", "member-service"); n != 0 {
		t.Errorf("member-service's row shows %d controls to an operator of audit-service only", n)
	}
	if n := controls("message.notification.events", "audit-service"); n == 0 {
		t.Error("audit-service's row on message.notification.events shows no control to its operator")
	}
	// On member.points.events audit-service is the last enabled consumer:
	// disabling it would drop the topic's new events, an admin's call.
	if b.count(`[data-testid=topic][data-topic="member.points.events"] [data-testid=disable]`) != 0 ||
		b.count(`[data-testid=topic][data-topic="member.points.events"] [data-testid=last-consumer]`) != 1 {
		t.Error("the last enabled consumer of member.points.events may be disabled by an operator, or the console does not say why not")
	}
	if n := b.count("[data-testid=add-consumer]"); n != 0 {
		t.Error("an operator is offered to add a consumer (an admin's)")
	}
	b.shot("scoped-operator")
	if status := b.fetch("POST", "/consumers/member.points.events/audit-service:disable", nil); status != http.StatusForbidden {
		t.Errorf("disabling the last consumer of a topic as its consumer's operator answered %d, want 403", status)
	}
	// message-service's dead letter: viewed (and dry-run), not replayed.
	b.open("/deadletters/" + letterID)
	b.waitFor("the letter, viewed", `!!document.querySelector("[data-testid=dry-run]") && !!document.querySelector("[data-testid=letter-data]")`, 20*time.Second)
	if n := b.count("[data-testid=replay], [data-testid=delete]"); n != 0 {
		t.Error("message-service's letter offers a replay or delete to an operator of audit-service")
	}
	if status := b.fetch("POST", "/deadletters/"+letterID+":replay", map[string]any{}); status != http.StatusForbidden {
		t.Errorf("replaying message-service's letter answered %d, want 403", status)
	}
	// audit-service's gaps may be skipped by its operator; its rebuild is
	// an admin's.
	b.open("/consumers/member.points.events/audit-service/rebuild")
	b.waitFor("the rebuild form", `!!document.querySelector("[data-testid=rebuild-dry-run]")`, 20*time.Second)
	if n := b.count("[data-testid=rebuild-run]"); n != 0 {
		t.Error("an operator is offered a rebuild (an admin's)")
	}
	// Every refusal is in the audit log, with who was refused and why.
	entries, err := stack.Ledger.Audit().List(ctx, audit.Query{Outcome: audit.OutcomeRefused, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	refused := map[string]bool{}
	for _, e := range entries {
		if e.By == dlqreplay.Anonymous && strings.Contains(e.Detail, "role") {
			refused[e.Action] = true
		}
	}
	if !refused[audit.ConsumerDisable] || !refused[audit.LetterReplay] {
		t.Errorf("refusals recorded %v, want the disable and the replay (%+v)", refused, entries)
	}
}

// serveConsole builds a dlqreplay from cfg (over the stack's stores, as the
// stack builds its own) and serves it; it returns the console's URL.
func serveConsole(t *testing.T, cfg dlqreplay.Config) string {
	t.Helper()
	fn, err := dlqreplay.Build(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fn.Close(context.Background()) })
	mux := http.NewServeMux()
	mux.Handle("/dlqreplay/", http.StripPrefix("/dlqreplay", fn))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/dlqreplay/console/"
}
