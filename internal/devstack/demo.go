package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/brokeropen"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/event"
)

// Demo runs the purchase scenario (docs/local-stack.md "make demo") against a
// running stack and reports to out. It returns an error naming the first
// thing that is not exactly as expected.
//
//  1. order.purchased goes through POST /publish (its payload asks
//     message-service to fail its first attempt);
//  2. member-service (push) adds points and emits points.added;
//     message-service (Eventarc) fails once, succeeds on redelivery and
//     emits notification.sent; audit-service records both children;
//  3. the ledger walks SENT → ... → CONSUMED; the demo prints each status,
//     the attempt table and the trace tree;
//  4. a poison message (no aggregate id) published straight to the topic
//     is dead-lettered by both consumers with its reason, archived, and
//     replayed to member-service alone;
//  5. projections and inboxes are checked row by row.
func Demo(ctx context.Context, info Info, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	store, err := stackLedger(ctx, info)
	if err != nil {
		return err
	}
	defer store.Close()
	pool, err := pgxpool.New(ctx, info.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// member-service keeps its points, inbox and outbox in its own database.
	memberURL := info.Databases["member"]
	if memberURL == "" {
		memberURL = info.DatabaseURL
	}
	memberPool, err := pgxpool.New(ctx, memberURL)
	if err != nil {
		return err
	}
	defer memberPool.Close()
	ps, err := brokeropen.Open(ctx, instance.PubSub{EmulatorHost: info.PubSubHost, Transport: info.Transport, NATSURL: info.NATSURL}, info.Project)
	if err != nil {
		return err
	}
	defer ps.Close()

	run := event.NewID()[:8]
	orderID, memberID := "order-"+run, "member-"+run
	env := map[string]any{
		"eventType": "order.purchased", "topic": "shop.order.events", "aggregateType": "order",
		"aggregateId": orderID, "version": 1, "source": "order-service",
		"payload":   map[string]any{"orderId": orderID, "memberId": memberID, "amount": 120, "failFirstNotify": true},
		"initiator": map[string]any{"service": "web", "operation": "checkout", "userId": "u-" + run},
	}
	body, _ := json.Marshal(env)
	start := time.Now()
	resp, err := http.Post(info.URL+"/publish", "application/json", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	var res struct {
		EventID string `json:"eventId"`
		Status  string `json:"status"`
		TraceID string `json:"traceId"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("publish answered %d, want 202", resp.StatusCode)
	}
	fmt.Fprintf(out, "1. POST /publish order.purchased %s -> 202 %s (event %s, trace %s)\n", orderID, res.Status, res.EventID, res.TraceID)

	fmt.Fprintln(out, "2. ledger status of the order event:")
	var last model.Status
	var det query.Detail
	for {
		d, err := query.New(store.Client()).Get(ctx, res.EventID)
		if err == nil {
			det = d
			if d.Event.Status != last {
				last = d.Event.Status
				fmt.Fprintf(out, "   %6dms  %-9s %s\n", time.Since(start).Milliseconds(), last, d.Summary())
			}
			if last == model.StatusConsumed {
				break
			}
		} else if !errors.Is(err, model.ErrEventNotFound) {
			return err
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return fmt.Errorf("the order never became CONSUMED (last %s): %w", last, err)
		}
	}

	fmt.Fprintln(out, "3. attempts:")
	fmt.Fprintf(out, "   %-16s %-8s %-14s %s\n", "CONSUMER", "ATTEMPT", "OUTCOME", "ERROR")
	var attempts []string
	for _, c := range det.Consumers {
		for _, a := range c.Attempts {
			fmt.Fprintf(out, "   %-16s %-8d %-14s %s\n", a.ConsumerID, a.AttemptNo, a.Outcome, a.ErrorCode)
			attempts = append(attempts, fmt.Sprintf("%s#%d:%s", a.ConsumerID, a.AttemptNo, a.Outcome))
		}
	}
	want := "member-service#1:success message-service#1:retry message-service#2:success"
	if got := strings.Join(attempts, " "); got != want {
		return fmt.Errorf("attempts %q, want %q", got, want)
	}

	// The children travel through the consumers' outbox and the relay.
	var tr query.Trace
	for {
		tr, err = query.New(store.Client()).Trace(ctx, res.EventID)
		if err != nil {
			return err
		}
		if tr.Count == 3 && allConsumed(tr.Roots) {
			break
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("the trace has %d events, not all CONSUMED: %w", tr.Count, err)
		}
	}
	fmt.Fprintf(out, "4. trace %s (%d events, %dms from publish to the last CONSUMED):\n", tr.TraceID, tr.Count, time.Since(start).Milliseconds())
	printTree(out, tr.Roots, "   ")
	if len(tr.Roots) != 1 || len(tr.Roots[0].Children) != 2 {
		return errors.New("the trace is not one order with two children")
	}

	// Projections and inboxes, exactly: member-service's in its database,
	// message-service's and audit-service's in main.
	var points int64
	var notes, memberInbox, messageInbox, auditInbox int
	var children []string
	for _, c := range tr.Roots[0].Children {
		children = append(children, c.Event.EventID)
	}
	q := func(p *pgxpool.Pool, dst any, sql string, args ...any) error {
		return p.QueryRow(ctx, sql, args...).Scan(dst)
	}
	if err := errors.Join(
		q(memberPool, &points, `SELECT points FROM shop_member_points WHERE member_id = $1`, memberID),
		q(pool, &notes, `SELECT count(*) FROM shop_notifications WHERE order_id = $1`, orderID),
		q(memberPool, &memberInbox, `SELECT count(*) FROM relaybus_inbox WHERE event_id = $1 AND consumer_id = 'member-service'`, res.EventID),
		q(pool, &messageInbox, `SELECT count(*) FROM relaybus_inbox WHERE event_id = $1 AND consumer_id = 'message-service'`, res.EventID),
		q(pool, &auditInbox, `SELECT count(*) FROM relaybus_inbox WHERE consumer_id = 'audit-service' AND event_id = ANY($1)`, children),
	); err != nil {
		return err
	}
	orderInbox := memberInbox + messageInbox
	fmt.Fprintf(out, "5. member %s has %d points; %d notification; inbox rows: order %d (member-service, message-service), children %d (audit-service)\n",
		memberID, points, notes, orderInbox, auditInbox)
	if points != 120 || notes != 1 || orderInbox != 2 || auditInbox != 2 {
		return errors.New("projections or inboxes are not exactly as expected (want 120 points, 1 notification, 2 and 2 inbox rows)")
	}

	// A poison message, straight onto the topic.
	poisonID := "poison-" + run
	if _, err := ps.Publish(ctx, "shop.order.events", event.Message{Data: []byte(`{"note":"no aggregate id"}`),
		Attributes: map[string]string{"event_id": poisonID, "event_type": "order.purchased"}}); err != nil {
		return err
	}
	letters, err := waitLetters(ctx, info.URL, poisonID, 2)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "6. poison message %s (no aggregate id) dead-lettered to %s and archived:\n", poisonID, names.DeadLetter("shop.order.events"))
	var memberLetter string
	for _, c := range []string{"member-service", "message-service"} {
		l, ok := letters[c]
		if !ok {
			return fmt.Errorf("%s did not dead-letter the poison message", c)
		}
		fmt.Fprintf(out, "   %-16s reason %-22s letter %s\n", c, l.Reason, l.ID)
		if l.Reason != event.ReasonMissingAggregateID {
			return fmt.Errorf("%s dead-lettered it as %q", c, l.Reason)
		}
		if c == "member-service" {
			memberLetter = l.ID
		}
	}
	// Replay member-service's letter: only member-service receives it (the
	// subscriptions filter on target_consumer); it is still poison, so it
	// comes back as a new letter from member-service alone.
	resp, err = http.Post(info.URL+"/dlqreplay/deadletters/"+memberLetter+":replay", "application/json", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("replay answered %d", resp.StatusCode)
	}
	again, err := waitLetters(ctx, info.URL, poisonID, 3)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "7. POST /dlqreplay/deadletters/%s:replay -> only member-service received it again (letters now: member-service %d, message-service %d)\n",
		memberLetter, again["#member-service"].Deliveries, again["#message-service"].Deliveries)
	if again["#member-service"].Deliveries != 2 || again["#message-service"].Deliveries != 1 {
		return errors.New("the replay did not reach member-service alone")
	}
	fmt.Fprintln(out, "demo: OK")
	return nil
}

type letter struct {
	ID, Consumer, Reason, EventID string
	// Deliveries here counts the letters per consumer (see waitLetters).
	Deliveries int
}

// waitLetters polls the archive until it holds want letters for eventID and
// returns the newest per consumer, plus "#<consumer>" entries whose
// Deliveries count that consumer's letters.
func waitLetters(ctx context.Context, base, eventID string, want int) (map[string]letter, error) {
	for {
		resp, err := http.Get(base + "/dlqreplay/deadletters?pageSize=500")
		if err != nil {
			return nil, err
		}
		var page struct {
			DeadLetters []letter `json:"deadLetters"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		out := map[string]letter{}
		n := 0
		for _, l := range page.DeadLetters {
			if l.EventID != eventID {
				continue
			}
			n++
			if _, seen := out[l.Consumer]; !seen {
				out[l.Consumer] = l
			}
			c := out["#"+l.Consumer]
			c.Deliveries++
			out["#"+l.Consumer] = c
		}
		if n >= want {
			return out, nil
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, fmt.Errorf("the archive holds %d letters for %s, want %d: %w", n, eventID, want, err)
		}
	}
}

func allConsumed(nodes []*query.TraceNode) bool {
	for _, n := range nodes {
		if n.Event.Status != model.StatusConsumed || !allConsumed(n.Children) {
			return false
		}
	}
	return true
}

func printTree(out io.Writer, nodes []*query.TraceNode, indent string) {
	for _, n := range nodes {
		e := n.Event
		fmt.Fprintf(out, "%s%s %s v%d on %s [%s] %s\n", indent, e.EventType, e.AggregateID, e.Version, e.Topic, e.Status, e.EventID)
		printTree(out, n.Children, indent+"  └ ")
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
