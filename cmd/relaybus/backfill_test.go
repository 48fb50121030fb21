package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// relaybus backfill counts (--dry-run), creates and drives a backfill to
// its end; pause, resume and show act on it; a bad flag is named. Against
// the real API over the Firestore emulator, Postgres (events published by
// a real relay, half of them moved to the history) and pstest.
func TestBackfillCommands(t *testing.T) {
	ctx := context.Background()
	top, store, pool, fake := cliBackends(t)
	var evs []*event.Event
	for _, a := range []string{"o-1", "o-2"} {
		for v := int64(1); v <= 3; v++ {
			evs = append(evs, &event.Event{ID: fmt.Sprintf("%s-v%d", a, v), Type: "order.purchased", Source: "order-service",
				Topic: "shop.order.events", AggregateID: a, Version: v, Payload: []byte(`{}`)})
		}
	}
	if _, err := outbox.Enqueue(ctx, pool, evs...); err != nil {
		t.Fatal(err)
	}
	drainOutbox(t, pool, fake, top)
	if _, err := outbox.PurgeWith(ctx, pool, outbox.PurgeOptions{Before: time.Now().Add(time.Minute), Limit: 3,
		History: outbox.History{Default: time.Hour}}); err != nil {
		t.Fatal(err)
	}
	h, err := dlqreplay.New(dlqreplay.Options{Archive: archive.New(store.Client()), Ledger: store, DB: pool, Publisher: fake.Client, Topology: top,
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
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	scope := []string{"--topic", "shop.order.events", "--consumer", "member-service", "--since", since}

	if code, out := cli(append([]string{"backfill", "--dry-run"}, scope...)...); code != 0 || !strings.Contains(out, "6 event(s) to backfill") {
		t.Fatalf("backfill --dry-run: exit %d\n%s", code, out)
	}
	if code, out := cli("backfill", "--topic", "shop.order.events"); code != 2 || !strings.Contains(out, "give --topic, --consumer and --since") {
		t.Errorf("backfill without a consumer: exit %d\n%s", code, out)
	}
	if code, out := cli(append([]string{"backfill", "--rate", "0.5"}, scope...)...); code != 1 || !strings.Contains(out, "rate: events per second, from 1 to 100000") {
		t.Errorf("backfill --rate 0.5: exit %d\n%s", code, out)
	}
	code, out := cli(append([]string{"-o", "json", "backfill", "--aggregates", "o-2"}, scope...)...)
	var b struct {
		ID, State       string
		Matched, Queued int
	}
	if err := json.Unmarshal([]byte(out), &b); code != 0 || err != nil || b.State != "done" || b.Matched != 3 || b.Queued != 3 {
		t.Fatalf("backfill: exit %d\n%s", code, out)
	}
	if code, out := cli("backfill", "show", b.ID); code != 0 || !strings.Contains(out, "done") || !strings.Contains(out, "aggregates o-2") {
		t.Errorf("backfill show: exit %d\n%s", code, out)
	}
	if code, out := cli("backfill", "pause", b.ID); code != 1 || !strings.Contains(out, "is done: it cannot be paused") {
		t.Errorf("backfill pause of a done backfill: exit %d\n%s", code, out)
	}
	if code, out := cli("backfills"); code != 0 || !strings.Contains(out, b.ID) || !strings.Contains(out, "3/3") {
		t.Errorf("backfills: exit %d\n%s", code, out)
	}
}

// relaybus consumers rebuild --history pauses audit-service (a pull
// consumer here: by its own flag), clears its state, starts a backfill per
// subscription from the history and drives each to its end, printing
// them; the backfilled events are then queued to audit-service alone.
func TestRebuildFromTheHistoryCommand(t *testing.T) {
	ctx := context.Background()
	top, store, pool, fake := cliBackends(t)
	if err := inbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := projection.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var evs []*event.Event
	for v := int64(1); v <= 3; v++ {
		evs = append(evs, &event.Event{ID: fmt.Sprintf("m-1-v%d", v), Type: "points.added", Source: "member-service",
			Topic: "member.points.events", AggregateType: "member", AggregateID: "m-1", Version: v, Payload: []byte(`{}`)})
	}
	if _, err := outbox.Enqueue(ctx, pool, evs...); err != nil {
		t.Fatal(err)
	}
	drainOutbox(t, pool, fake, top)
	h, err := dlqreplay.New(dlqreplay.Options{Archive: archive.New(store.Client()), Ledger: store, DB: pool, Publisher: fake.Client, Topology: top,
		Auth: dlqreplay.AuthNone, Writers: []string{dlqreplay.Anonymous}, RateLimit: -1, PauseSettle: time.Millisecond,
		PullConsumers: []string{"member.points.events.audit-service-recorder", "message.notification.events.audit-service-recorder"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	var out, errOut bytes.Buffer
	code := run(ctx, []string{"--api", srv.URL, "consumers", "rebuild", "--history", "--time", since, "member.points.events", "audit-service"}, &out, &errOut, http.DefaultClient)
	if code != 0 || strings.Count(out.String(), "done") < 2 || !regexp.MustCompile(`queued\s+3\n`).MatchString(out.String()) {
		t.Fatalf("consumers rebuild --history: exit %d\n%s%s", code, out.String(), errOut.String())
	}
	var queued int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_outbox_repush WHERE target_consumer = 'audit-service'`).Scan(&queued); err != nil || queued != 3 {
		t.Fatalf("%d re-pushes queued to audit-service (%v), want the 3 events", queued, err)
	}
}

// drainOutbox publishes what pool's outbox holds to fake with a real relay,
// in one drain.
func drainOutbox(t *testing.T, pool relay.DB, fake *pubsubtest.Fake, top *topology.Topology) {
	t.Helper()
	ctx := context.Background()
	r, err := relay.New(relay.Options{DB: pool, Publisher: fake.Client, Topology: top, Retention: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	if _, err := r.Drain(ctx, 20*time.Second); err != nil {
		t.Fatal(err)
	}
}
