package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/shared/event"
)

// relaybus replay counts, then runs a job; relaybus jobs shows it, and
// cancel refuses a job that ended. Against the real API over the Firestore
// emulator, Postgres and pstest.
func TestReplayJobCommands(t *testing.T) {
	ctx := context.Background()
	top, store, pool, fake := cliBackends(t)
	arc := archive.New(store.Client())
	at := time.Date(2026, 11, 22, 10, 5, 0, 0, time.UTC)
	for _, id := range []string{"evt-a", "evt-b"} {
		ev := &event.Event{ID: id, Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
			AggregateID: "order-" + id, Version: 1, Payload: []byte(`{}`), OccurredAt: at}
		_ = ev.Prepare(at, event.Limits{})
		if err := store.RecordSent(ctx, model.SentAt(at, ev)); err != nil {
			t.Fatal(err)
		}
		a := model.Attempt{EventID: id, ConsumerID: "member-service", AttemptNo: 1, Outcome: model.OutcomeDeadLettered, ErrorCode: "timeout", ConsumedAt: at, Topic: ev.Topic}
		if _, err := store.Fold(ctx, []model.Notice{{EventID: id, Attempts: []model.Attempt{a}}}, 0); err != nil {
			t.Fatal(err)
		}
		m, _ := cloudevent.Encode(ev, event.EncodingJSON)
		dl := deadletter.PubSub(m, "p", "shop.order.events.member-service-processor", 5)
		dl.ID = "dl-" + id
		if _, _, err := arc.Archive(ctx, "shop.order.events.dlq", dl); err != nil {
			t.Fatal(err)
		}
	}
	h, err := dlqreplay.New(dlqreplay.Options{Archive: arc, Ledger: store, DB: pool, Publisher: fake.Client, Topology: top,
		Auth: dlqreplay.AuthNone, Writers: []string{dlqreplay.Anonymous}, RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	cli := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := run(ctx, append([]string{"--api", srv.URL}, args...), &out, &errOut, http.DefaultClient)
		return code, out.String() + errOut.String()
	}
	filter := []string{"--topic", "shop.order.events", "--consumer", "member-service", "--since", "2026-11-22T10:00:00Z", "--until", "2026-11-22T10:40:00Z", "--outcome", "dead_lettered"}

	if code, out := cli(append([]string{"replay", "--dry-run"}, filter...)...); code != 0 || !strings.Contains(out, "2 event(s) match") || !strings.Contains(out, "evt-a") {
		t.Fatalf("replay --dry-run: exit %d\n%s", code, out)
	}
	if code, out := cli("replay", "--topic", "shop.order.events"); code != 2 || !strings.Contains(out, "give --topic, --consumer, --since, --until and --outcome") {
		t.Errorf("replay without a window: exit %d\n%s", code, out)
	}
	if code, out := cli("replay", "--topic", "shop.order.events", "--consumer", "member-service", "--since", "yesterday", "--until", "2026-11-22T10:40:00Z", "--outcome", "failed"); code != 2 || !strings.Contains(out, "since") {
		t.Errorf("replay --since yesterday: exit %d\n%s", code, out)
	}
	if code, out := cli(append([]string{"replay", "--rate", "500"}, filter...)...); code != 1 || !strings.Contains(out, "rate: events per second, from 0.1 to 100") {
		t.Errorf("replay --rate 500: exit %d\n%s", code, out)
	}
	// replay counts, creates the job and drives it to its end.
	code, out := cli(append([]string{"-o", "json", "replay", "--rate", "50"}, filter...)...)
	var j struct {
		ID, State string
		Matched   int
	}
	if err := json.Unmarshal([]byte(out), &j); code != 0 || err != nil || j.State != "done" || j.Matched != 2 {
		t.Fatalf("replay: exit %d\n%s", code, out)
	}
	if code, out := cli("jobs", "run", j.ID); code != 0 || !strings.Contains(out, "state      done") {
		t.Errorf("jobs run of an ended job: exit %d\n%s", code, out)
	}
	code, out = cli("jobs", "show", j.ID)
	for _, want := range []string{"state      done", "sent       2", "remaining  0", "dead_lettered of member-service, shop.order.events 2026-11-22T10:00:00Z..2026-11-22T10:40:00Z"} {
		if !strings.Contains(out, want) {
			t.Errorf("jobs show: exit %d, want %q in\n%s", code, want, out)
		}
	}
	if code, out := cli("jobs"); code != 0 || !strings.Contains(out, j.ID) || !strings.Contains(out, "2/2") {
		t.Errorf("jobs: exit %d\n%s", code, out)
	}
	if code, out := cli("jobs", "cancel", j.ID); code != 1 || !strings.Contains(out, "409 not_running") {
		t.Errorf("jobs cancel of a finished job: exit %d\n%s", code, out)
	}
	if code, out := cli("jobs", "show"); code != 2 {
		t.Errorf("jobs show without an id: exit %d\n%s", code, out)
	}
}
