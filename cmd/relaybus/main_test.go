package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func TestMain(m *testing.M) { pgtest.Main(m) }

// cliBackends starts what the CLI's API runs on in a test: the topology,
// the ledger on the Firestore emulator, an outbox schema in Postgres and
// pstest with every topic and subscription.
func cliBackends(t *testing.T) (*topology.Topology, *ledger.Store, *pgxpool.Pool, *pubsubtest.Fake) {
	t.Helper()
	ctx := context.Background()
	emutest.Host(t, emulator.Firestore)
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: emutest.FirestoreProject(t)}, ledger.Options{Registry: registry.FromTopology(top)})
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
	return top, store, pool, fake
}

// The CLI against the real dlqreplay API over the Firestore emulator,
// Postgres and pstest: a purchase with one child event, one consumer's
// attempts, and a dead letter. Output is compared with testdata/*.golden.
func TestGoldenOutput(t *testing.T) {
	ctx := context.Background()
	top, store, pool, fake := cliBackends(t)
	// The consumers' own delivery control (pause of an Eventarc consumer)
	// lives in their inbox schema.
	if err := inbox.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	order := &event.Event{ID: "evt-order-1", Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
		AggregateID: "order-1", Version: 1, Payload: []byte(`{}`), TraceID: "trace-1", OccurredAt: at}
	points := &event.Event{ID: "evt-points-1", Type: "points.added", Source: "member-service", Topic: "member.points.events",
		AggregateID: "m-1", Version: 1, Payload: []byte(`{}`), TraceID: "trace-1", ParentEventID: "evt-order-1", OccurredAt: at.Add(time.Second)}
	for _, e := range []*event.Event{order, points} {
		_ = e.Prepare(at, event.Limits{})
	}
	if err := store.RecordSent(ctx, model.SentAt(at, order, points)); err != nil {
		t.Fatal(err)
	}
	// The attempt documents the rollup writes from consume's notices.
	if err := store.InsertAttempts(ctx, []model.Attempt{
		{EventID: "evt-order-1", ConsumerID: "message-service", AttemptNo: 1, Outcome: model.OutcomeRetry, ErrorCode: "demo_first_attempt", ErrorMessage: "gateway timed out", ConsumedAt: at},
		{EventID: "evt-order-1", ConsumerID: "message-service", AttemptNo: 2, Success: true, Outcome: model.OutcomeSuccess, ConsumedAt: at},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Rollup(ctx, "evt-order-1"); err != nil {
		t.Fatal(err)
	}
	arc := archive.New(store.Client())
	dl := deadletter.Poison(event.Message{Data: []byte(`{}`), Attributes: map[string]string{"event_id": "evt-poison"}},
		event.ReasonMissingAggregateID, "no aggregate id", "member-service", "shop.order.events.member-service-processor", at)
	dl.ID = "dl-1"
	if _, _, err := arc.Archive(ctx, "shop.order.events.dlq", dl); err != nil {
		t.Fatal(err)
	}
	if _, err := consumers.New(store.Client(), consumers.Options{}).SyncConsumers(ctx, registry.Consumers(top), consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	h, err := dlqreplay.New(dlqreplay.Options{Archive: arc, Ledger: store, DB: pool, Publisher: fake.Client, Topology: top,
		Auth: dlqreplay.AuthToken, Token: `{"ops@example.com": "t0k-0123456789abcdef0123456789abcdef"}`, Audience: "https://relaybus-dlqreplay-test.a.run.app",
		Archivers: []string{"relaybus-dlq-push@relaybus-test.iam.gserviceaccount.com"}, Writers: []string{"ops@example.com"}, RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	for _, c := range []struct {
		name string
		args []string
		code int
	}{
		{"events_ls", []string{"events", "ls", "--topic", "shop.order.events"}, 0},
		{"events_ls_by_type", []string{"events", "ls", "--type", "points.added"}, 0},
		{"events_show", []string{"events", "show", "evt-order-1"}, 0},
		{"events_trace", []string{"events", "trace", "evt-order-1"}, 0},
		{"events_ls_bad_time", []string{"events", "ls", "--from", "yesterday"}, 2},
		{"events_ls_bad_status", []string{"events", "ls", "--status", "DONE"}, 1},
		{"dlq_ls", []string{"dlq", "ls"}, 0},
		{"dlq_show", []string{"dlq", "show", "dl-1"}, 0},
		{"dlq_replay_dry", []string{"dlq", "replay", "--dry-run", "dl-1"}, 0},
		{"dlq_replay_all_count", []string{"dlq", "replay-all", "--consumer", "member-service"}, 0},
		{"dlq_replay_all_yes", []string{"dlq", "replay-all", "--consumer", "member-service", "--yes"}, 0},
		{"dlq_replay_all_done", []string{"dlq", "replay-all", "--consumer", "member-service"}, 0},
		{"repush", []string{"repush", "--consumer", "audit-service", "evt-points-1"}, 0},
		{"repush_unknown", []string{"repush", "evt-nope"}, 1},
		{"unknown", []string{"dlq", "show", "nope"}, 1},
		{"usage", []string{"events"}, 2},
		{"unknown_command", []string{"evnets", "ls"}, 2},
		{"missing_argument", []string{"events", "show"}, 2},
		{"seek_unconfigured", []string{"seek", "--time", "2026-11-20T08:00:00Z", "member.points.events.audit-service-recorder"}, 1},
		{"dlq_ls_json_filtered", []string{"-o", "json", "dlq", "ls", "--reason", "missing_aggregate_id"}, 0},
		{"dlq_ls_json_filtered_out", []string{"-o", "json", "dlq", "ls", "--reason", "max_delivery_attempts"}, 0},
		{"consumers_ls", []string{"consumers", "ls"}, 0},
		{"consumers_disable", []string{"consumers", "disable", "shop.order.events", "message-service"}, 0},
		{"consumers_disable_again", []string{"consumers", "disable", "shop.order.events", "message-service"}, 0},
		{"consumers_ls_after_disable", []string{"consumers", "ls", "--topic", "shop.order.events"}, 0},
		{"consumers_enable", []string{"consumers", "enable", "shop.order.events", "message-service"}, 0},
		{"consumers_enable_unknown", []string{"consumers", "enable", "shop.order.events", "nobody"}, 1},
		{"whoami", []string{"whoami"}, 0},
		{"consumers_pause_eventarc", []string{"consumers", "pause", "shop.order.events", "message-service"}, 0},
		{"consumers_resume_eventarc", []string{"consumers", "resume", "shop.order.events", "message-service"}, 0},
		{"gaps_ls", []string{"gaps", "ls", "message.notification.events", "audit-service"}, 0},
		{"gaps_ls_not_strict", []string{"gaps", "ls", "shop.order.events", "member-service"}, 1},
		{"gaps_skip_nothing_parked", []string{"gaps", "skip", "--aggregate", "u-42", "--version", "7", "message.notification.events", "audit-service"}, 1},
		{"gaps_skip_usage", []string{"gaps", "skip", "message.notification.events", "audit-service"}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(ctx, append([]string{"--api", srv.URL, "--token", "t0k-0123456789abcdef0123456789abcdef"}, c.args...), &out, &errOut, http.DefaultClient)
			if code != c.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, c.code, errOut.String())
			}
			golden(t, c.name, append(out.Bytes(), errOut.Bytes()...))
		})
	}
	// A rebuild's answers carry times (the retention's edge), so they are
	// checked by content rather than against a golden file.
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"consumers", "rebuild", "--dry-run", "--time", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339), "member.points.events", "audit-service"}, 0, "wouldClear"},
		{[]string{"consumers", "rebuild", "--time", "2020-01-01T00:00:00Z", "member.points.events", "audit-service"}, 1, "409 retention: member.points.events.audit-service-recorder retains messages for 168h0m0s"},
		{[]string{"consumers", "rebuild", "--time", "2020-01-01T00:00:00Z", "--snapshot", "s", "member.points.events", "audit-service"}, 2, "exactly one of --time and --snapshot"},
	} {
		var out, errOut bytes.Buffer
		code := run(ctx, append([]string{"--api", srv.URL, "--token", "t0k-0123456789abcdef0123456789abcdef"}, c.args...), &out, &errOut, http.DefaultClient)
		if code != c.code || !strings.Contains(out.String()+errOut.String(), c.want) {
			t.Errorf("%v: exit %d (want %d), output %s%s; want it to say %q", c.args, code, c.code, out.String(), errOut.String(), c.want)
		}
	}
	// The registry's and the delivery control's changes are audited with
	// the token holder's name.
	var out, errOut bytes.Buffer
	if code := run(ctx, []string{"--api", srv.URL, "--token", "t0k-0123456789abcdef0123456789abcdef", "-o", "json", "consumers", "audit"}, &out, &errOut, http.DefaultClient); code != 0 {
		t.Fatalf("audit: %d %s", code, errOut.String())
	}
	var audit struct {
		Entries []struct{ Action, By, ConsumerID, Outcome, Detail string }
	}
	if err := json.Unmarshal(out.Bytes(), &audit); err != nil {
		t.Fatalf("audit %s: %v", out.String(), err)
	}
	var done []string
	for _, e := range audit.Entries {
		if e.Outcome == "succeeded" && e.Detail != "nothing changed" {
			done = append(done, e.Action+" by "+e.By)
		}
	}
	if strings.Join(done, ", ") != "consumer.resume by ops@example.com, consumer.pause by ops@example.com, consumer.enable by ops@example.com, consumer.disable by ops@example.com" {
		t.Errorf("changes made %v, want the disable, the enable, the pause and the resume, by ops@example.com, newest first (audit %s)", done, out.String())
	}
}

// fixtureEnd is later than every time the fixture sets (2026-11-22): a
// timestamp after it in the output comes from the wall clock (archivedAt,
// a replay's time, deleteAt), and golden writes it as <wall clock>.
var fixtureEnd = time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)

var timestamp = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)

// golden compares got with testdata/<name>.golden (-update rewrites it),
// with wall-clock timestamps masked.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	got = timestamp.ReplaceAllFunc(got, func(ts []byte) []byte {
		if at, err := time.Parse(time.RFC3339Nano, string(ts)); err == nil && at.After(fixtureEnd) {
			return []byte("<wall clock>")
		}
		return ts
	})
	path := filepath.Join("testdata", name+".golden")
	if *update {
		_ = os.MkdirAll("testdata", 0o755)
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("output differs from %s:\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}
