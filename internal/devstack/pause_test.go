package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/shared/event"
)

// Pause and resume of one consumer through the operations API on the local
// stack (its delivery loop stands in for the push subscription): while
// member-service is paused an order reaches message-service and never
// member-service, whose attempt counter stays at zero; after the resume it
// is applied on its first attempt. An Eventarc consumer is refused.
func TestPauseAndResumeOnTheLocalStack(t *testing.T) {
	ctx := context.Background()
	s := startOnTestSchema(t, 500*time.Millisecond)
	defer closeStack(s)
	main, err := pgxpool.New(ctx, s.Info.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer main.Close()
	memberURL := s.Info.Databases["member"]
	if memberURL == "" {
		memberURL = s.Info.DatabaseURL
	}
	member, err := pgxpool.New(ctx, memberURL)
	if err != nil {
		t.Fatal(err)
	}
	defer member.Close()
	api := s.Info.URL + "/dlqreplay/consumers/shop.order.events/"
	post := func(url string, body any) (int, map[string]any) {
		t.Helper()
		b, _ := json.Marshal(body)
		resp, err := http.Post(url, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	// applied returns the attempt that applied the event at a consumer (0: none).
	applied := func(db *pgxpool.Pool, consumer, id string) (n int) {
		t.Helper()
		_ = db.QueryRow(ctx, `SELECT attempt_no FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = $2`, consumer, id).Scan(&n)
		return n
	}
	attempts := func(consumer, id string) (n int) {
		t.Helper()
		_ = member.QueryRow(ctx, `SELECT coalesce(max(attempt_no), 0) FROM relaybus_attempts WHERE consumer_id = $1 AND event_id = $2`, consumer, id).Scan(&n)
		return n
	}

	// An Eventarc consumer is paused by its own flag (its trigger owns its
	// subscription's push configuration), and resumed.
	if code, out := post(api+"message-service:pause", nil); code != 200 || out["control"] != "consumer-flag" || out["paused"] != true {
		t.Fatalf("pausing an Eventarc consumer: %d %v", code, out)
	}
	if code, out := post(api+"message-service:resume", nil); code != 200 || out["paused"] != false {
		t.Fatalf("resuming an Eventarc consumer: %d %v", code, out)
	}
	if code, out := post(api+"member-service:pause", nil); code != 200 || out["paused"] != true || out["changed"] != true {
		t.Fatalf("pause: %d %v", code, out)
	}
	run := event.NewID()[:8]
	code, res := post(s.Info.URL+"/publish", map[string]any{"eventType": "order.purchased", "topic": "shop.order.events",
		"aggregateId": "order-" + run, "version": 1, "source": "order-service",
		"payload": map[string]any{"orderId": "order-" + run, "memberId": "member-" + run, "amount": 5}})
	if code != http.StatusAccepted {
		t.Fatalf("publish: %d %v", code, res)
	}
	id := res["eventId"].(string)
	// The order is on the topic: the consumer that is not paused takes it.
	eventually.True(t, 30*time.Second, "message-service applies the order", func() bool { return applied(main, "message-service", id) > 0 })
	// member-service's subscription holds it: observed for a while, never
	// delivered, no attempt counted.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if n := applied(member, "member-service", id) + attempts("member-service", id); n != 0 {
			t.Fatalf("member-service got the order while paused (inbox attempt + counter %d)", n)
		}
	}
	resp, err := http.Get(api + "member-service/delivery")
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if st["paused"] != true {
		t.Errorf("delivery state while paused: %v", st)
	}

	if code, out := post(api+"member-service:resume", nil); code != 200 || out["paused"] != false || out["changed"] != true {
		t.Fatalf("resume: %d %v", code, out)
	}
	eventually.True(t, 30*time.Second, "member-service applies the order after the resume", func() bool { return applied(member, "member-service", id) > 0 })
	if n := applied(member, "member-service", id); n != 1 {
		t.Errorf("member-service applied the order on attempt %d, want 1 (the pause burned attempts)", n)
	}
}
