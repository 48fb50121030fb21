package dlqreplay_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/privacy"
	"github.com/relaybus/relaybus/internal/privacy/topologyrules"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

// syncBuffer is a log sink the API's goroutines may write at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Two customers' orders go through the outbox, the ledger and the dead
// letter archive; erasing one leaves none of their plaintext in any of the
// stores, the audit log or the log output, and their dead letter and event
// cannot be replayed or re-pushed, while the other's are untouched.
func TestEraseBySubject(t *testing.T) {
	ctx := context.Background()
	emutest.Host(t, emulator.Firestore)
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	const topic = "shop.order.events"
	for i := range top.Topics {
		if top.Topics[i].Name == topic {
			top.Topics[i].Privacy = topology.Privacy{Fields: []string{"/email"}, Subject: "/customerId"}
		}
	}
	key, _ := privacy.NewKey("erase-test-key-0123456789")
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: emutest.FirestoreProject(t)}, ledger.Options{Registry: registry.FromTopology(top),
		Privacy: topologyrules.Of(top), PrivacyKey: key, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	pool := pgtest.Schema(t)
	if err := outbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	fake := pubsubtest.New(t)
	fake.Provision(t, top)
	arc := archive.New(store.Client())
	h, err := dlqreplay.New(dlqreplay.Options{Archive: arc, Ledger: store, DB: pool, Publisher: fake.Client, Topology: top,
		Writers: []string{dlqreplay.Anonymous}, Archivers: []string{dlqreplay.Anonymous}, RateLimit: -1, Logger: log, Auth: dlqreplay.AuthNone})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/dlqreplay/", http.StripPrefix("/dlqreplay", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	e := &env{url: srv.URL + "/dlqreplay", fake: fake, store: store, db: pool, archive: arc, top: top, h: h}

	// Two events per customer in the outbox and the ledger, one dead
	// letter each.
	// The subject ids are in the payloads only: the envelope (event id,
	// aggregate id) is not erased.
	type customer struct{ id, email, order string }
	alice, bob := customer{"cust-alice-7f3a", "alice.erased@example.com", "a"}, customer{"cust-bob-22c1", "bob.kept@example.com", "b"}
	now := time.Now().UTC()
	var sends []model.Sent
	events := map[string][]*event.Event{}
	for _, c := range []customer{alice, bob} {
		for v := int64(1); v <= 2; v++ {
			ev := &event.Event{ID: fmt.Sprintf("evt-%s-%d", c.order, v), Type: "order.purchased", Source: "order-service", Topic: topic,
				AggregateID: "order-" + c.order, Version: v,
				Payload: []byte(fmt.Sprintf(`{"customerId":%q,"email":%q,"total":%d}`, c.id, c.email, 100*v))}
			if err := ev.Prepare(now, event.Limits{}); err != nil {
				t.Fatal(err)
			}
			if _, err := outbox.Enqueue(ctx, pool, ev); err != nil {
				t.Fatal(err)
			}
			sends = append(sends, model.Sent{Event: ev, EnqueuedAt: now, At: now})
			events[c.id] = append(events[c.id], ev)
		}
		m, err := cloudevent.Encode(events[c.id][1], event.EncodingJSON)
		if err != nil {
			t.Fatal(err)
		}
		dl := deadletter.PubSub(m, "p", "shop.order.events.message-service-processor", 5)
		dl.ID = "dl-" + c.order
		e.archiveDelivery(t, dl)
	}
	if err := store.RecordSent(ctx, sends); err != nil {
		t.Fatal(err)
	}
	// The ledger keeps the payloads redacted: the email hashed, so equal
	// emails still compare equal; the console says which field.
	var shown struct {
		Event map[string]any `json:"event"`
	}
	if code := e.call(t, "GET", "/events/evt-"+bob.order+"-1", nil, &shown); code != 200 {
		t.Fatalf("get bob's event: %d", code)
	}
	if p, _ := shown.Event["payload"].(map[string]any); p["email"] != key.HashValue(bob.email) || p["customerId"] != bob.id {
		t.Errorf("bob's event as shown: %v, want the email hashed", shown.Event)
	}
	if fmt.Sprint(shown.Event["redactedFields"]) != "[/email]" {
		t.Errorf("redactedFields %v, want [/email]", shown.Event["redactedFields"])
	}

	bobRows := outboxPayloads(t, e, bob.order)
	var rep struct {
		SubjectKey string         `json:"subjectKey"`
		Report     privacy.Report `json:"report"`
		Message    string         `json:"message"`
	}
	if code := e.call(t, "POST", "/erasures", map[string]string{"subject": alice.id}, &rep); code != 200 || !rep.Report.Complete {
		t.Fatalf("erase: %d %+v", code, rep)
	}
	erased := map[string]int{}
	for _, s := range rep.Report.Stores {
		erased[s.Store] = s.Erased
	}
	if erased["outbox:main"] != 2 || erased["ledger"] != 2 || erased["archive"] != 1 {
		t.Errorf("erased %v, want 2 outbox rows, 2 ledger events, 1 dead letter", erased)
	}
	// Again: nothing left to erase.
	if code := e.call(t, "POST", "/erasures", map[string]string{"subject": alice.id}, &rep); code != 200 {
		t.Fatalf("second erase: %d", code)
	}
	for _, s := range rep.Report.Stores {
		if s.Erased != 0 {
			t.Errorf("second erasure changed %d records in %s", s.Erased, s.Store)
		}
	}

	// Replays after erasure deliver nothing.
	var apiErr struct{ Code, Message string }
	if code := e.call(t, "POST", "/deadletters/dl-"+alice.order+":replay", nil, &apiErr); code != 409 || apiErr.Code != "deleted" {
		t.Errorf("replay of the erased subject's dead letter: %d %+v, want 409 deleted", code, apiErr)
	}
	if code := e.call(t, "POST", "/events/evt-"+alice.order+"-1:repush", nil, &apiErr); code != 410 || apiErr.Code != "erased" {
		t.Errorf("re-push of an erased event: %d %+v, want 410 erased", code, apiErr)
	}
	var replayed map[string]any
	if code := e.call(t, "POST", "/deadletters/dl-"+bob.order+":replay", nil, &replayed); code != 200 || replayed["messageId"] == "" {
		t.Errorf("replay of the other subject's dead letter: %d %v", code, replayed)
	}

	// No store holds the erased subject's plaintext; the other's is as it was.
	secrets := []string{alice.id, alice.email}
	for _, p := range outboxPayloads(t, e, alice.order) {
		if p != outbox.ErasedPayload {
			t.Errorf("erased subject's outbox payload %s, want %s", p, outbox.ErasedPayload)
		}
	}
	if got := outboxPayloads(t, e, bob.order); fmt.Sprint(got) != fmt.Sprint(bobRows) || len(got) != 2 {
		t.Errorf("other subject's outbox payloads %v, want %v", got, bobRows)
	}
	var all bytes.Buffer
	for _, col := range []string{model.CollectionEvents, "dead_letters", "operator_audit"} {
		docs, err := store.Client().Collection(col).Documents(ctx).GetAll()
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range docs {
			fmt.Fprintf(&all, "%s/%s %v\n", col, d.Ref.ID, flatten(d))
		}
	}
	rows, err := pool.Query(ctx, `SELECT convert_from(payload, 'UTF8') FROM relaybus_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		all.WriteString(s + "\n")
	}
	rows.Close()
	stored, logged := all.String(), logs.String()
	for _, s := range secrets {
		if strings.Contains(stored, s) {
			t.Errorf("%q is still stored:\n%s", s, stored)
		}
		if strings.Contains(logged, s) {
			t.Errorf("%q is in the log output:\n%s", s, logged)
		}
	}
	if !strings.Contains(stored, bob.id) || !strings.Contains(stored, bob.email) {
		t.Errorf("the other subject's payloads are gone:\n%s", stored)
	}
	var bobLetter archive.Letter
	if bobLetter, err = arc.Get(ctx, "dl-"+bob.order); err != nil || bobLetter.Deleted || !bytes.Contains(bobLetter.Data, []byte(bob.email)) {
		t.Errorf("the other subject's dead letter: %+v %v", bobLetter, err)
	}
}

// outboxPayloads returns the payloads of one order's outbox rows.
func outboxPayloads(t *testing.T, e *env, order string) []string {
	t.Helper()
	rows, err := e.db.Query(context.Background(), `SELECT convert_from(payload, 'UTF8') FROM relaybus_outbox WHERE aggregateid = $1 ORDER BY version`, "order-"+order)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// flatten renders a document's fields, bytes as text, for a search.
func flatten(d *firestore.DocumentSnapshot) string {
	var b strings.Builder
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case []byte:
			b.Write(x)
		case map[string]any:
			for k, v := range x {
				b.WriteString(k + "=")
				walk(v)
				b.WriteString(" ")
			}
		case []any:
			for _, v := range x {
				walk(v)
				b.WriteString(" ")
			}
		default:
			fmt.Fprint(&b, x)
		}
	}
	walk(d.Data())
	return b.String()
}
