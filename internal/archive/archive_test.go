package archive_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"cloud.google.com/go/firestore"
	"gopkg.in/yaml.v3"

	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/privacy"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

func TestMain(m *testing.M) {
	code := m.Run()
	emutest.Cleanup()
	os.Exit(code)
}

func client(t *testing.T) *firestore.Client {
	t.Helper()
	c, err := firestore.NewClient(context.Background(), emutest.FirestoreProject(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func message(id, eventID string) event.Message {
	return event.Message{ID: id, Data: []byte(`{}`), Attributes: map[string]string{event.AttrEventID: eventID}}
}

// deadLettered is orig as Pub/Sub publishes it to the dead-letter topic
// after sub gave up, with the id it gets there.
func deadLettered(orig event.Message, sub string) event.Message {
	m := deadletter.PubSub(orig, "p", sub, 5)
	m.ID = orig.ID
	return m
}

// Every letter carries deleteAt = archivedAt + retention, as a Firestore
// timestamp (what a TTL policy needs).
func TestRetentionSetsDeleteAt(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	at := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	clock := archive.WithClock(func() time.Time { return at })
	for _, tc := range []struct {
		name      string
		retention time.Duration
		want      time.Duration
	}{{"default", 0, archive.DefaultRetention}, {"ARCHIVE_RETENTION=48h", 48 * time.Hour, 48 * time.Hour}} {
		t.Run(tc.name, func(t *testing.T) {
			s := archive.New(c, clock, archive.WithRetention(tc.retention))
			id := "dl-" + strings.ReplaceAll(tc.name, "=", "-")
			l, created, err := s.Archive(ctx, "shop.order.events.dlq", deadLettered(message(id, "evt-1"), "shop.order.events.member-service-processor"))
			if err != nil || !created {
				t.Fatalf("archive: %v %v", created, err)
			}
			if !l.DeleteAt.Equal(at.Add(tc.want)) {
				t.Errorf("deleteAt %v, want %v", l.DeleteAt, at.Add(tc.want))
			}
			snap, err := c.Collection(model.CollectionDeadLetters).Doc(id).Get(ctx)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := snap.DataAt("deleteAt")
			if ts, ok := raw.(time.Time); err != nil || !ok || !ts.Equal(at.Add(tc.want)) {
				t.Errorf("stored deleteAt %T %v (%v), want the timestamp %v", raw, raw, err, at.Add(tc.want))
			}
		})
	}
}

// A consumer delivered by Eventarc fails on the trigger's own subscription,
// and that is the name Pub/Sub stamps on its dead letters: with the map the
// letter names its consumer (so it can be replayed to it), including
// letters archived before the map was configured.
func TestEventarcDeadLettersResolveToTheirConsumer(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	const logical = "shop.order.events.message-service-processor"
	const real = "eventarc-europe-west1-consume-message-service-processor-1a2b3c4d-sub-417"
	subs, err := topology.NewSubscriptionMap(top, map[string]string{logical: "projects/p/subscriptions/" + real})
	if err != nil {
		t.Fatal(err)
	}
	before := archive.New(c) // no map yet
	old, _, err := before.Archive(ctx, "shop.order.events.dlq", deadLettered(message("dl-old", "evt-old"), real))
	if err != nil {
		t.Fatal(err)
	}
	if old.Consumer != "" || old.Subscription != real {
		t.Fatalf("without the map the letter cannot name its consumer: %+v", old)
	}
	s := archive.New(c, archive.WithSubscriptions(subs))
	l, _, err := s.Archive(ctx, "shop.order.events.dlq", deadLettered(message("dl-new", "evt-new"), real))
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range []archive.Letter{l, mustGet(t, s, "dl-new"), mustGet(t, s, "dl-old")} {
		if got.Consumer != "message-service" || got.Subscription != logical || got.PubSubSubscription != real {
			t.Errorf("letter %s: consumer %q subscription %q pubsub %q, want message-service %s %s", got.ID, got.Consumer, got.Subscription, got.PubSubSubscription, logical, real)
		}
	}
	page, _, err := s.List(ctx, archive.Filter{Consumer: "message-service"}, 10, "")
	if err != nil || len(page) != 2 {
		t.Errorf("filter by the resolved consumer: %d letters, %v", len(page), err)
	}
}

func mustGet(t *testing.T, s *archive.Store, id string) archive.Letter {
	t.Helper()
	l, err := s.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestSummarizeCountsByTopicAndConsumer(t *testing.T) {
	ctx := context.Background()
	s := archive.New(client(t))
	archiveAs := func(id, topic, sub string) {
		if _, _, err := s.Archive(ctx, topic+".dlq", deadLettered(message(id, "evt-"+id), sub)); err != nil {
			t.Fatal(err)
		}
	}
	archiveAs("a1", "shop.order.events", "shop.order.events.member-service-processor")
	archiveAs("a2", "shop.order.events", "shop.order.events.member-service-processor")
	archiveAs("a3", "shop.order.events", "shop.order.events.message-service-processor")
	archiveAs("a4", "member.points.events", "member.points.events.audit-service-recorder")
	if _, err := s.Delete(ctx, "a4", "op@example.com"); err != nil {
		t.Fatal(err)
	}
	sum, err := s.Summarize(ctx, archive.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	want := []archive.TopicConsumerCount{
		{Topic: "shop.order.events", Consumer: "member-service", Count: 2},
		{Topic: "shop.order.events", Consumer: "message-service", Count: 1},
	}
	if sum.Total != 3 || !reflect.DeepEqual(sum.ByTopicConsumer, want) {
		t.Errorf("summary %+v, want 3 letters %+v (the deleted one not counted)", sum, want)
	}
	sum, _ = s.Summarize(ctx, archive.Filter{Consumer: "member-service"})
	if sum.Total != 2 {
		t.Errorf("filtered summary: %d, want 2", sum.Total)
	}
	if _, _, err := s.List(ctx, archive.Filter{}, 10, "no-such-letter"); err == nil || !strings.Contains(err.Error(), archive.ErrBadPageToken.Error()) {
		t.Errorf("unknown page token: %v", err)
	}
}

// infra/firestore/indexes.yaml exempts deleteAt (a TTL timestamp) and no
// field the archive orders by.
func TestIndexExemptions(t *testing.T) {
	b, err := os.ReadFile("../../infra/firestore/indexes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Exemptions []struct{ Collection, Field string } `yaml:"exemptions"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	fields := map[string]bool{}
	typ := reflect.TypeFor[archive.Letter]()
	for i := 0; i < typ.NumField(); i++ {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("firestore"), ",")
		fields[name] = true
	}
	exempt := map[string]bool{}
	for _, e := range f.Exemptions {
		if e.Collection != model.CollectionDeadLetters {
			continue
		}
		if !fields[e.Field] {
			t.Errorf("exemption dead_letters/%s: no such field in archive.Letter", e.Field)
		}
		exempt[e.Field] = true
	}
	if !exempt["deleteAt"] {
		t.Error("dead_letters/deleteAt is not exempt from indexing")
	}
	if exempt["archivedAt"] {
		t.Error("dead_letters/archivedAt is exempt, but List and Summarize order by it")
	}
}

// A topic whose privacy rule sets the archive to redact keeps its letters
// with the personal fields hashed, in the shape they came in; one set to
// drop keeps no payload; a topic without a rule keeps the letter whole.
// Nothing of the personal values reaches Firestore.
func TestArchiveAppliesThePrivacyRule(t *testing.T) {
	ctx := context.Background()
	c := client(t)
	key, err := privacy.NewKey("archive-test-key-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	rules := privacy.Rules{
		"shop.customer.events": {Fields: []string{"/email"}, ArchiveMode: privacy.Redact},
		"shop.card.events":     {Fields: []string{"/pan"}, ArchiveMode: privacy.Drop},
	}
	s := archive.New(c, archive.WithPrivacy(rules, key))
	letter := func(id, topic string, enc event.Encoding, payload string) archive.Letter {
		t.Helper()
		e := event.Event{ID: "evt-" + id, Type: "customer.changed", Source: "customer-service", Topic: topic,
			AggregateID: "C-1", Version: 1, OccurredAt: time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC), Payload: []byte(payload)}
		e.Normalize()
		m, err := cloudevent.Encode(&e, enc)
		if err != nil {
			t.Fatal(err)
		}
		m.ID = id
		l, created, err := s.Archive(ctx, topic+".dlq", deadLettered(m, topic+".member-service-processor"))
		if err != nil || !created {
			t.Fatalf("archive %s: %v %v", id, created, err)
		}
		got, err := s.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.RedactedFields, l.RedactedFields) || got.PayloadWithheld != l.PayloadWithheld {
			t.Errorf("%s: stored %v/%v, returned %v/%v", id, got.RedactedFields, got.PayloadWithheld, l.RedactedFields, l.PayloadWithheld)
		}
		snap, err := c.Collection(model.CollectionDeadLetters).Doc(id).Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if raw := fmt.Sprint(snap.Data()); strings.Contains(raw, "ann@example.com") || strings.Contains(raw, "4111") {
			t.Errorf("%s: Firestore holds a personal value: %s", id, raw)
		}
		return got
	}
	payloadOf := func(l archive.Letter) map[string]any {
		t.Helper()
		e, _, err := cloudevent.Decode(l.Original(), event.Limits{MaxPayloadBytes: event.MaxPayloadLimit})
		if err != nil {
			t.Fatalf("%s: the redacted letter no longer decodes: %v", l.ID, err)
		}
		var p map[string]any
		if err := json.Unmarshal(e.Payload, &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, enc := range []event.Encoding{event.EncodingJSON, event.EncodingProtobuf, event.EncodingBinary} {
		l := letter("redact-"+string(enc), "shop.customer.events", enc, `{"email":"ann@example.com","tier":"gold"}`)
		p := payloadOf(l)
		if !reflect.DeepEqual(l.RedactedFields, []string{"/email"}) || p["tier"] != "gold" || p["email"] != key.Hash([]byte(`"ann@example.com"`)) || l.PayloadKept() {
			t.Errorf("%s: redactedFields %v, payload %v, kept %v; want /email hashed, tier kept", enc, l.RedactedFields, p, l.PayloadKept())
		}
	}
	if l := letter("drop", "shop.card.events", event.EncodingJSON, `{"pan":"4111111111111111"}`); !l.PayloadWithheld || len(l.Data) != 0 || l.PayloadKept() {
		t.Errorf("drop: withheld %v, data %q; want withheld and no data", l.PayloadWithheld, l.Data)
	}
	poison := event.Message{ID: "poison", Data: []byte(`{"email":"ann@example.com"`), Attributes: map[string]string{}}
	if l, _, err := s.Archive(ctx, "shop.customer.events.dlq", deadLettered(poison, "shop.customer.events.member-service-processor")); err != nil || !l.PayloadWithheld || len(l.Data) != 0 {
		t.Errorf("poison under redact: %v, withheld %v, data %q; want no data", err, l.PayloadWithheld, l.Data)
	}
	whole := letter("whole", "shop.order.events", event.EncodingJSON, `{"email":"bob@example.com"}`)
	if !whole.PayloadKept() || payloadOf(whole)["email"] != "bob@example.com" {
		t.Errorf("a topic without a rule: %+v, want the letter whole", whole)
	}
}
