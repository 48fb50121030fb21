package consume

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"cloud.google.com/go/pubsub/v2"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/broker"
	brokerpubsub "github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/forward"
	"github.com/relaybus/relaybus/shared/topology"
)

// The registered function builds itself from the environment (migrations
// included) and applies a push delivery; an unknown handler name is refused
// with the names it knows.
func TestServeFromEnvironment(t *testing.T) {
	emutest.Host(t, emulator.PubSub) // make test's, or one started for the test binary
	_, schema := pgtest.SchemaConfig(t, nil)
	t.Setenv("GOOGLE_CLOUD_PROJECT", fmt.Sprintf("consume-env-%d", time.Now().UnixNano()))
	t.Setenv("DATABASE_URL", pgtest.SchemaURL(t, schema))
	t.Setenv("LEDGER", "off")
	t.Setenv("CONSUMER_ID", "audit-service")
	t.Setenv("CONSUMER_HANDLER", "strict")
	srv := httptest.NewServer(instance.Lazy("consume", instance.FromEnv(instance.Load[Config], Build)))
	defer srv.Close()
	e := &event.Event{Type: "points.added", Source: "member-service", Topic: "member.points.events", AggregateID: "m-1",
		Version: 1, Payload: []byte(`{"balance":10}`)}
	_ = e.Prepare(time.Now(), event.Limits{})
	m, _ := cloudevent.Encode(e, event.EncodingJSON)
	m.ID = "msg-1"
	resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(delivery.WrappedBody(m, "member.points.events.audit-service-recorder", 1)))
	if err != nil {
		t.Fatal(err)
	}
	var res consumer.Result
	_ = json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if resp.StatusCode != 200 || res.Outcome != "success" {
		t.Fatalf("env-built consume: %d %+v", resp.StatusCode, res)
	}
	if _, err := BuildHandler("nope", HandlerConfig{}); err == nil || !bytes.Contains([]byte(err.Error()), []byte(`CONSUMER_HANDLER="nope": unknown handler; known: `)) ||
		!bytes.Contains([]byte(err.Error()), []byte("forward, projection, strict")) {
		t.Errorf("unknown handler: %v", err)
	}
}

// With the production default LEDGER=firestore (the emulator): the attempt
// reaches the ledger after the answer, and the child event the handler
// emitted is on Pub/Sub without waiting for a scheduled drain.
func TestServeFromEnvironmentWithTheLedger(t *testing.T) {
	emutest.Host(t, emulator.PubSub) // make test's, or one started for the test binary
	ctx := context.Background()
	_, schema := pgtest.SchemaConfig(t, nil)
	project := emutest.FirestoreProject(t)
	top, _ := topology.Load("")
	ps, err := brokerpubsub.New(ctx, project, brokerpubsub.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if err := ps.Provision(ctx, top); err != nil {
		t.Fatal(err)
	}
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: project}, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	t.Setenv("GOOGLE_CLOUD_PROJECT", project)
	t.Setenv("DATABASE_URL", pgtest.SchemaURL(t, schema))
	t.Setenv("CONSUMER_ID", "member-service")
	t.Setenv("CONSUMER_HANDLER", "example.points")
	// Cloud Run names the revision; the child events carry it.
	t.Setenv("K_REVISION", "member-service-00007-abc")
	srv := httptest.NewServer(instance.Lazy("consume", instance.FromEnv(instance.Load[Config], Build)))
	defer srv.Close()
	e := &event.Event{Type: "order.purchased", Source: "order-service", Topic: "shop.order.events", AggregateID: "order-1",
		Version: 1, Payload: []byte(`{"orderId":"order-1","memberId":"m-1","amount":5}`)}
	_ = e.Prepare(time.Now(), event.Limits{})
	m, _ := cloudevent.Encode(e, event.EncodingJSON)
	m.ID = "msg-1"
	resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(delivery.WrappedBody(m, "shop.order.events.member-service-processor", 1)))
	if err != nil {
		t.Fatal(err)
	}
	var res consumer.Result
	_ = json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if resp.StatusCode != 200 || res.Outcome != "success" {
		t.Fatalf("env-built consume: %d %+v", resp.StatusCode, res)
	}
	// The child (points.added on member.points.events) reaches Pub/Sub by the kick.
	sub := ps.PubSub().Subscriber("member.points.events.audit-service-recorder")
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var child, childVersion string
	_ = sub.Receive(cctx, func(_ context.Context, m *pubsub.Message) {
		child, childVersion = m.Attributes[event.AttrEventType], m.Attributes[event.AttrSourceVersion]
		m.Ack()
		cancel()
	})
	if child != "points.added" || childVersion != "member-service-00007-abc" {
		t.Errorf("the child event did not reach Pub/Sub with the revision as its source version (got %q, %q)", child, childVersion)
	}
	// The attempt is shipped to the ledger: a first attempt that succeeded
	// travels in the rollup notice, which the rollup folds into the event's
	// document (the relay never recorded this test's send, so there is no
	// document to fold it into here), and no attempt document is written.
	got, sends := receiveNotice(t, ps, broker.RollupSubscription(top), e.ID)
	if len(got.Attempts) != 1 || got.Attempts[0].ConsumerID != "member-service" || !got.Attempts[0].Success {
		t.Fatalf("the notice carries %+v, want member-service's success", got.Attempts)
	}
	if len(sends) != 1 || sends[0].Event.Type != "points.added" || sends[0].Event.ParentEventID != e.ID {
		t.Errorf("the sends notice carries %+v, want the points.added child of %s", sends, e.ID)
	}
	if n := attemptsOf(t, store, e.ID); n != 0 {
		t.Errorf("%d attempt documents, want none for a first attempt that succeeded", n)
	}
}

// receiveNotice waits for the rollup notice that names eventID and for a
// sends notice (the child events consume kicked, recorded by the rollup:
// consume writes nothing in Firestore), and returns what the first says
// of eventID and the sends of the second.
func receiveNotice(t *testing.T, ps *brokerpubsub.Client, sub, eventID string) (model.Notice, []model.Sent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var (
		mu    sync.Mutex
		out   model.Notice
		sends []model.Sent
	)
	_ = ps.PubSub().Subscriber(sub).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		mu.Lock()
		defer mu.Unlock()
		msg := event.Message{ID: m.ID, Data: m.Data, Attributes: m.Attributes}
		if model.IsSendsNotice(msg) {
			ss, err := model.ReadSends(msg)
			if err != nil {
				t.Errorf("sends notice: %v", err)
			}
			sends = append(sends, ss...)
		} else {
			ns, err := model.ReadNotice(msg)
			if err != nil {
				t.Errorf("notice: %v", err)
				return
			}
			for _, n := range ns {
				if n.EventID == eventID {
					out = n
				}
			}
		}
		if out.EventID != "" && len(sends) > 0 {
			cancel()
		}
	})
	if out.EventID == "" || len(sends) == 0 {
		t.Fatalf("within 20s: the notice for %s %v, sends notices %d", eventID, out.EventID != "", len(sends))
	}
	return out, sends
}

// attemptsOf counts an event's attempt documents in the ledger.
func attemptsOf(t *testing.T, s *ledger.Store, eventID string) int {
	t.Helper()
	docs, err := s.Client().Collection(model.CollectionEvents).Doc(model.EventDocID(eventID)).
		Collection(model.CollectionConsumptions).Documents(context.Background()).GetAll()
	if err != nil {
		t.Fatal(err)
	}
	return len(docs)
}

// A topology consumer's forward and strict fields reach the handlers:
// forward_auth hmac without its secret is refused with the variable to
// set; with it, the forwarder signs; a strict consumer gets its gap timeout.
func TestHandlerConfigForTheTopologysFields(t *testing.T) {
	top, err := topology.Parse([]byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers:
      - service: partner-service
        handler: forward
        forward_url: https://partner.example.com/hooks
        forward_auth: hmac
        forward_secret: partner-signing-secret
      - service: audit-service
        handler: strict
        gap_timeout_seconds: 900
`))
	if err != nil {
		t.Fatal(err)
	}
	cs := top.Consumers()
	if _, err := BuildHandler(cs[0].Handler, HandlerConfigFor(cs[0], nil, nil)); err == nil || !strings.Contains(err.Error(), "FORWARD_SIGNING_SECRET") {
		t.Errorf("hmac without its secret: %v", err)
	}
	h, err := BuildHandler(cs[0].Handler, HandlerConfigFor(cs[0], []string{forward.NewSecret()}, nil))
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := h.(*forward.Forwarder); !ok || f.Lease() != 15*time.Second {
		t.Errorf("forward handler %T, want a forwarder leasing its 10 s timeout + 5 s", h)
	}
	h, err = BuildHandler(cs[1].Handler, HandlerConfigFor(cs[1], nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	if g, ok := h.(GapKeeper); !ok || g.GapTimeout() != 15*time.Minute {
		t.Errorf("strict handler %T, want a GapKeeper with a 15-minute gap timeout", h)
	}
}
