package dlqreplay_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/relaybus/relaybus/shared/forward"
)

// The console's Forwarders page over the real API (Postgres, pstest, the
// Firestore emulator, the forwarders service): an operator adds a
// forwarder through the form, sees the API's rule under the URL field
// when the URL is bad, changes its URL and flow limits, switches it to
// hmac and is shown its signing secret once, follows its link to a
// backfill form filled in for it, and removes it after a confirmation.
// After each step the page shows it and the API's registry holds it.
func TestConsoleAddsChangesAndRemovesAForwarder(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test starts Chromium")
	}
	s := newForwardersStack(t)
	hook := newWebhook(t)
	row := `[data-testid=forwarder-row][data-forwarder="crm-webhook"]`
	stored := func() map[string]any {
		t.Helper()
		a := s.do(t, "GET", "/forwarders/crm-webhook", nil)
		if a.status != 200 {
			t.Fatalf("GET /forwarders/crm-webhook: %d %s", a.status, a.raw)
		}
		return a.body["forwarder"].(map[string]any)
	}

	b := newBrowser(t, s.url+"/console/")
	b.open("/forwarders")
	b.waitFor("the empty list", `!!document.querySelector("[data-testid=no-forwarders]")`, 20*time.Second)

	// A bad URL: the API's rule under the field, nothing added.
	b.click("[data-testid=forwarder-add]")
	b.run("fill the form", 10*time.Second,
		chromedp.SetValue("[data-testid=forwarder-name]", "crm-webhook", chromedp.ByQuery),
		chromedp.SetValue("[data-testid=forwarder-topic]", "shop.order.events", chromedp.ByQuery),
		chromedp.SetValue("[data-testid=forwarder-url]", "ftp://crm.example.com/hook", chromedp.ByQuery),
		chromedp.SetValue("[data-testid=forwarder-description]", "The CRM's order webhook.", chromedp.ByQuery))
	b.click("[data-testid=forwarder-save]")
	b.waitFor("the URL's error", `!!document.querySelector("[data-testid=field-error-url]")`, 20*time.Second)
	if got := b.text("[data-testid=field-error-url]"); !strings.Contains(got, "must be an absolute http(s) URL") {
		t.Errorf("the URL field's error reads %q", got)
	}
	if a := s.do(t, "GET", "/forwarders", nil); len(a.body["forwarders"].([]any)) != 0 {
		t.Fatalf("a refused form added a forwarder: %s", a.raw)
	}

	// Fixed: added, listed, the form closed, the error gone.
	b.run("fix the URL", 10*time.Second, chromedp.SetValue("[data-testid=forwarder-url]", hook.url, chromedp.ByQuery))
	b.click("[data-testid=forwarder-save]")
	b.waitFor("the new row", fmt.Sprintf(`!!document.querySelector(%q) && !document.querySelector("[data-testid=forwarder-form]")`, row), 20*time.Second)
	if got := b.text("[data-testid=forwarder-result]"); got != "Forwarder crm-webhook added: it receives shop.order.events's events from now on." {
		t.Errorf("the notice reads %q", got)
	}
	if got := b.text(row + " [data-testid=forwarder-url]"); got != hook.url {
		t.Errorf("the row's URL reads %q, want %s", got, hook.url)
	}
	if got := b.text(row + " [data-testid=forwarder-changed]"); !strings.HasPrefix(got, "added by anonymous ") {
		t.Errorf("the row's history reads %q", got)
	}
	if f := stored(); f["url"] != hook.url || f["auth"] != "none" || f["description"] != "The CRM's order webhook." || f["revision"] != float64(1) {
		t.Fatalf("stored: %v", f)
	}
	b.shot("forwarders")

	// Changed: a new URL and flow limits.
	hook2 := newWebhook(t)
	b.click(row + " [data-testid=forwarder-change]")
	b.waitFor("the change form", `!!document.querySelector("[data-testid=forwarder-form]")`, 10*time.Second)
	if n := b.count("[data-testid=forwarder-form] input[disabled]"); n != 3 {
		t.Errorf("%d fixed fields in the change form, want 3 (name, topic, filter)", n)
	}
	b.run("change the URL and limits", 10*time.Second,
		chromedp.SetValue("[data-testid=forwarder-url]", hook2.url, chromedp.ByQuery),
		chromedp.SetValue("[data-testid=forwarder-maxInFlight]", "4", chromedp.ByQuery),
		chromedp.SetValue("[data-testid=forwarder-maxPerSecond]", "20", chromedp.ByQuery))
	b.click("[data-testid=forwarder-save]")
	b.waitFor("the changed row", fmt.Sprintf(`document.querySelector(%q)?.textContent === "4 in flight, 20/s"`, row+" [data-testid=forwarder-flow]"), 20*time.Second)
	if got := b.text(row + " [data-testid=forwarder-url]"); got != hook2.url {
		t.Errorf("the changed row's URL reads %q", got)
	}
	if f := stored(); f["url"] != hook2.url || f["maxInFlight"] != float64(4) || f["maxPerSecond"] != float64(20) || f["revision"] != float64(2) {
		t.Fatalf("stored after the change: %v", f)
	}

	// Switched to hmac: the secret is shown once, then never again.
	b.click(row + " [data-testid=forwarder-change]")
	b.run("choose hmac", 10*time.Second, chromedp.SetValue("[data-testid=forwarder-auth]", "hmac", chromedp.ByQuery))
	b.click("[data-testid=forwarder-save]")
	b.waitFor("the signing secret", `!!document.querySelector("[data-testid=signing-secret]")`, 20*time.Second)
	secret := b.text("[data-testid=signing-secret]")
	if _, err := forward.ParseSecret(secret); err != nil || !strings.HasPrefix(secret, forward.SecretPrefix) {
		t.Fatalf("the page shows %q as the signing secret: %v", secret, err)
	}
	b.waitFor("the row's auth hmac", fmt.Sprintf(`document.querySelector(%q)?.textContent === "hmac"`, row+" [data-testid=forwarder-auth-kind]"), 20*time.Second)
	if f := stored(); f["auth"] != "hmac" || f["revision"] != float64(3) {
		t.Fatalf("stored after the switch to hmac: %v", f)
	}
	b.open("/forwarders")
	b.waitFor("the row", fmt.Sprintf(`!!document.querySelector(%q)`, row), 20*time.Second)
	var page string
	b.run("read the page", 10*time.Second, chromedp.Evaluate(`document.documentElement.outerHTML`, &page))
	if strings.Contains(page, strings.TrimPrefix(secret, forward.SecretPrefix)) {
		t.Fatal("the reloaded page shows the signing secret")
	}
	if n := b.count(row + " [data-testid=forwarder-rotate]"); n != 1 {
		t.Errorf("%d rotate buttons on the hmac forwarder, want 1", n)
	}

	// Its backfill link opens the backfill form filled in for it.
	b.click(row + " [data-testid=forwarder-backfill]")
	b.waitFor("the backfill form", `!!document.querySelector("[data-testid=backfill-form]")`, 20*time.Second)
	var topic, consumer string
	b.run("read the backfill form", 10*time.Second,
		chromedp.Value("[data-testid=backfill-new-topic]", &topic, chromedp.ByQuery),
		chromedp.Value("[data-testid=backfill-new-consumer]", &consumer, chromedp.ByQuery))
	if topic != "shop.order.events" || consumer != "crm-webhook" {
		t.Errorf("the backfill form holds %q and %q, want the forwarder's topic and name", topic, consumer)
	}

	// Removed after the confirmation.
	b.open("/forwarders")
	b.waitFor("the row", fmt.Sprintf(`!!document.querySelector(%q)`, row), 20*time.Second)
	b.click(row + " [data-testid=forwarder-remove]")
	b.waitFor("the remove confirmation", `document.getElementById("confirm").open`, 10*time.Second)
	if got := b.text("#confirm-body"); !strings.Contains(got, "shop.order.events.crm-webhook-forwarder is deleted") {
		t.Errorf("the confirmation reads %q", got)
	}
	b.click("#confirm-ok")
	b.waitFor("the empty list", `!!document.querySelector("[data-testid=no-forwarders]")`, 20*time.Second)
	if got := b.text("[data-testid=forwarder-result]"); got != "Forwarder crm-webhook removed: its subscription is deleted and delivery has stopped." {
		t.Errorf("the notice reads %q", got)
	}
	if a := s.do(t, "GET", "/forwarders/crm-webhook", nil); a.status != 404 {
		t.Fatalf("after the removal GET answers %d %s, want 404", a.status, a.raw)
	}
}
