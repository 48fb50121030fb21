package dlqreplay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/inbox"
)

// Whether a consumer is at its flow limits, as its consume instances
// report it in its database: GET /consumers says at its limits while an
// instance reported so in the last seconds, and otherwise when it last
// was, with the deliveries its instances refused; the console shows both.
func TestAConsumerAtItsLimitsShowsInTheConsole(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test starts Chromium")
	}
	ctx := context.Background()
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		o.Auth = dlqreplay.AuthNone
		for i := range o.Topology.Topics {
			for j := range o.Topology.Topics[i].Consumers {
				if c := &o.Topology.Topics[i].Consumers[j]; c.Service == "member-service" || c.Service == "message-service" {
					c.MaxInFlight = 4
				}
			}
		}
	})
	if err := inbox.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, r := range []struct {
		consumer string
		rep      inbox.FlowReport
	}{
		{"member-service", inbox.FlowReport{Instance: "rev-1-a", AtLimitAt: now, Refused: 3}},
		{"member-service", inbox.FlowReport{Instance: "rev-1-b", AtLimitAt: now.Add(-time.Hour), Refused: 2}},
		{"message-service", inbox.FlowReport{Instance: "rev-2-a", AtLimitAt: now.Add(-time.Minute), Refused: 0}},
	} {
		if err := inbox.ReportFlow(ctx, e.db, r.consumer, r.rep); err != nil {
			t.Fatal(err)
		}
	}
	var out struct {
		Consumers []struct {
			ConsumerID string `json:"consumerId"`
			Flow       struct {
				AtLimit     bool       `json:"atLimit"`
				LastAtLimit *time.Time `json:"lastAtLimit"`
				Refused     int64      `json:"refused"`
			} `json:"flow"`
		} `json:"consumers"`
	}
	if code := e.call(t, "GET", "/consumers?topic=shop.order.events", nil, &out); code != 200 {
		t.Fatalf("GET /consumers: %d", code)
	}
	got := map[string]string{}
	for _, c := range out.Consumers {
		last := "never"
		if c.Flow.LastAtLimit != nil {
			last = fmt.Sprintf("%.0fs ago", time.Since(*c.Flow.LastAtLimit).Round(time.Minute).Seconds())
		}
		got[c.ConsumerID] = fmt.Sprintf("at limit %v, last %s, refused %d", c.Flow.AtLimit, last, c.Flow.Refused)
	}
	if want := "at limit true, last 0s ago, refused 5"; got["member-service"] != want {
		t.Errorf("member-service: %s, want %s", got["member-service"], want)
	}
	if want := "at limit false, last 60s ago, refused 0"; got["message-service"] != want {
		t.Errorf("message-service: %s, want %s", got["message-service"], want)
	}

	b := newBrowser(t, e.url+"/console/")
	b.open("/consumers")
	row := func(c string) string {
		return fmt.Sprintf(`[data-testid=topic][data-topic="shop.order.events"] [data-testid=consumer-row][data-consumer=%s] [data-testid=consumer-flow]`, c)
	}
	b.waitFor("the consumers' flow", fmt.Sprintf(`!!document.querySelector(%q)`, row("message-service")), 20*time.Second)
	if got := b.text(row("member-service")); !strings.Contains(got, "≤ 4 in flight") || !strings.Contains(got, "at its limits") || !strings.Contains(got, "5 refused") {
		t.Errorf("member-service's flow reads %q, want its limit, at its limits, 5 refused", got)
	}
	if got := b.text(row("message-service")); !strings.Contains(got, "last at its limits") || strings.Contains(got, "refused") {
		t.Errorf("message-service's flow reads %q, want when it was last at its limits and nothing refused", got)
	}
	b.shot("consumer-flow")
}
