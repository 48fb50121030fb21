package dlqreplay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/registry"
)

// The console's Catalog page in headless Chromium, over the API on the
// Firestore emulator with the repository's topology: each topic's schemas,
// publishers and consumers as the operator reads them, an operator's
// disable shown, and one topic picked. Its screenshot is docs/catalog.md's
// (make screenshots).
func TestCatalogInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test starts Chromium")
	}
	e := newEnv(t, dlqreplay.AuthNone, "")
	if _, err := consumers.New(e.store.Client(), consumers.Options{}).SyncConsumers(context.Background(), registry.Consumers(e.top), consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, e.url+"/console/")
	b.open("/catalog")
	b.waitFor("every topic", `document.querySelectorAll("[data-testid=catalog-topic]").length === 3`, 20*time.Second)
	if cls := b.text(`a[data-nav=catalog].active`); cls != "Catalog" {
		t.Errorf("the active nav link says %q", cls)
	}
	order := `[data-testid=catalog-topic][data-topic="shop.order.events"] `
	member := order + `[data-testid=catalog-consumer][data-consumer="member-service"] `
	message := order + `[data-testid=catalog-consumer][data-consumer="message-service"] `
	for _, c := range []struct{ sel, want string }{
		{order + "[data-testid=no-schema]", "No schema: the topic takes any payload."},
		{member + "[data-testid=catalog-state]", "enabled"},
		{member + "[data-testid=catalog-delivery]", "pushordered\nshop.order.events.member-service-processor"},
		{member + "[data-testid=catalog-handler]", "example.points (registered)\ndatabase member"},
		{member + "[data-testid=catalog-emits]", "member.points.events"},
		{message + "[data-testid=catalog-delivery]", "eventarcunordered\nshop.order.events.message-service-processor"},
		{`[data-topic="member.points.events"] [data-testid=schema-row][data-version=v1] td:nth-child(2)`, "protobuf · json\nrelaybus.member.v1.PointsAdded"},
		{`[data-topic="member.points.events"] [data-testid=publisher]`, "member-service emits them handling shop.order.events"},
	} {
		if got := b.text(c.sel); got != c.want {
			t.Errorf("%s shows %q, want %q", c.sel, got, c.want)
		}
	}
	// The v1 schema's JSON Schema opens with protojson's field names.
	b.click(`[data-topic="member.points.events"] [data-testid=schema-row] summary`)
	if got := b.text(`[data-topic="member.points.events"] [data-testid=schema-shape]`); !strings.Contains(got, `"memberId"`) {
		t.Errorf("the JSON Schema shown: %q, want memberId in it", got)
	}
	b.shot("catalog")

	// An operator disables message-service: the page says so, and who did.
	if st := b.fetch("POST", "/consumers/shop.order.events/message-service:disable", map[string]any{}); st != 200 {
		t.Fatalf("disable: %d", st)
	}
	b.open("/catalog?topic=shop.order.events")
	b.waitFor("one topic", `document.querySelectorAll("[data-testid=catalog-topic]").length === 1 && !!document.querySelector("[data-testid=catalog-consumer]")`, 20*time.Second)
	if got := b.text(message + "[data-testid=catalog-state]"); got != "disabled" {
		t.Errorf("message-service after the disable: %q", got)
	}
	if got := b.text(message + "td:last-child"); !strings.HasPrefix(got, dlqreplay.Anonymous) {
		t.Errorf("message-service's registry entry says %q, want the operator (%s) who changed it", got, dlqreplay.Anonymous)
	}
	// The topic picker lists every topic, the shown one selected.
	if n := b.count("[data-testid=catalog-topic-filter] option"); n != 4 {
		t.Errorf("%d options in the topic picker, want every topic and 'every topic'", n)
	}
}
