package names

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateTopic(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"shop.order.events", true},
		{"catalog.video.events", true},
		{"media.transcode.events", true},
		{"video.events", true},
		{"shop.order.events.dlq", true},
		{"relaybus.ledger.rollup", true},
		{"feed.recommendation-v2.events", true},
		{"", false},
		{"events", false},
		{"a.b.c.d", false},
		{"Shop.order.events", false},
		{"shop_order.events", false},
		{"shop.order_item.events", false},
		{"shop..events", false},
		{".shop.events", false},
		{"shop.order.", false},
		{"shop.1order.events", false},
		{"shop.order.events.dlq.dlq", false},
		{"shop.dlq", false},
		{"shop order.events", false},
		{strings.Repeat("a", 64) + ".b.c", false},
	} {
		err := ValidateTopic(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateTopic(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
		var ne *Error
		if err != nil && (!errors.As(err, &ne) || ne.Rule != TopicRule || !strings.Contains(err.Error(), "<domain>.<aggregate>.<category>")) {
			t.Errorf("ValidateTopic(%q) error %q does not quote the rule", tc.name, err)
		}
	}
}

func TestParseSubscription(t *testing.T) {
	for _, tc := range []struct {
		in                    string
		topic, consumer, role string
		ok                    bool
	}{
		{"shop.order.events.member-service-processor", "shop.order.events", "member-service", "processor", true},
		{"catalog.video.events.search-indexer", "catalog.video.events", "search", "indexer", true},
		{"projects/p/subscriptions/shop.order.events.message-service-processor", "shop.order.events", "message-service", "processor", true},
		{"video.events.catalog-reader", "video.events", "catalog", "reader", true},
		{"shop.order.events.reader", "", "", "", false},
		{"shop.order.events.member-service-", "", "", "", false},
		{"shop.order.events.-reader", "", "", "", false},
		{"shop.order.events.Member-reader", "", "", "", false},
		{"shop.order.events.dlq.ops-reader", "", "", "", false},
		{"member-service-processor", "", "", "", false},
		{"", "", "", "", false},
	} {
		topic, consumer, role, err := ParseSubscription(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParseSubscription(%q) err = %v, want ok=%v", tc.in, err, tc.ok)
			continue
		}
		if err != nil {
			if !strings.Contains(err.Error(), SubscriptionRule) {
				t.Errorf("ParseSubscription(%q) error %q does not quote the rule", tc.in, err)
			}
			continue
		}
		if topic != tc.topic || consumer != tc.consumer || role != tc.role {
			t.Errorf("ParseSubscription(%q) = %q %q %q, want %q %q %q", tc.in, topic, consumer, role, tc.topic, tc.consumer, tc.role)
		}
	}
}

func TestSubscriptionBuildsWhatParseReads(t *testing.T) {
	name, err := Subscription("shop.order.events", "member-service", "processor")
	if err != nil {
		t.Fatal(err)
	}
	if name != "shop.order.events.member-service-processor" {
		t.Fatalf("got %q", name)
	}
	if _, err := Subscription("shop.order.events", "Member", "processor"); err == nil || !strings.Contains(err.Error(), ConsumerRule) {
		t.Fatalf("bad consumer accepted or rule not quoted: %v", err)
	}
	if _, err := Subscription("shop.order.events", "member", "proc-essor"); err == nil || !strings.Contains(err.Error(), RoleRule) {
		t.Fatalf("bad role accepted or rule not quoted: %v", err)
	}
}

func TestDeadLetterNames(t *testing.T) {
	if got := DeadLetter("shop.order.events"); got != "shop.order.events.dlq" || !IsDeadLetter(got) || ValidateTopic(got) != nil {
		t.Fatalf("DeadLetter = %q", got)
	}
	if got := DeadLetterMonitor("shop.order.events"); got != "shop.order.events.dlq-monitor" {
		t.Fatalf("DeadLetterMonitor = %q", got)
	}
	if ResourceID("projects/p/topics/a.b.c") != "a.b.c" || ResourceID("a.b.c") != "a.b.c" {
		t.Fatal("ResourceID")
	}
}
