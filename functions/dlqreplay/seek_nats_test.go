package dlqreplay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/broker/brokertest/natstest"
	"github.com/relaybus/relaybus/shared/broker/nats"
	"github.com/relaybus/relaybus/shared/topology"
)

// On NATS JetStream, POST /subscriptions/{name}:seek {"time"} rewinds the
// consumer's durable JetStream consumer to that time (recreated with
// DeliverByStartTime: nats.Client.SeekTime); a snapshot is Pub/Sub's and
// answers 501 saying to seek to a time.
func TestSeekOnNATS(t *testing.T) {
	ctx := context.Background()
	emutest.Host(t, emulator.Firestore)
	nc, err := nats.Connect(ctx, natstest.Server(t), nats.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	top, _ := topology.Load("")
	if err := nc.Provision(ctx, top); err != nil {
		t.Fatal(err)
	}
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: emutest.FirestoreProject(t)}, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	h, err := dlqreplay.New(dlqreplay.Options{Archive: archive.New(store.Client()), Ledger: store, DB: pgtest.Schema(t),
		Publisher: nc, Auth: dlqreplay.AuthNone, Writers: []string{dlqreplay.Anonymous}, Broker: nc})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func(path string, body any) (int, map[string]string) {
		b, _ := json.Marshal(body)
		resp, err := http.Post(srv.URL+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]string
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	const topic, sub = "member.points.events", "member.points.events.audit-service-recorder"
	at := time.Date(2026, 11, 20, 8, 0, 0, 0, time.UTC)
	if code, out := post("/subscriptions/"+sub+":seek", map[string]string{"time": at.Format(time.RFC3339)}); code != 200 {
		t.Fatalf("seek to a time: %d %v", code, out)
	}
	cons, err := nc.JetStream().Consumer(ctx, nats.StreamName(topic), nats.ConsumerName(sub))
	if err != nil {
		t.Fatal(err)
	}
	cfg := cons.CachedInfo().Config
	if cfg.DeliverPolicy != jetstream.DeliverByStartTimePolicy || cfg.OptStartTime == nil || !cfg.OptStartTime.Equal(at) {
		t.Errorf("the consumer after the seek: deliver policy %v from %v; want by start time from %v", cfg.DeliverPolicy, cfg.OptStartTime, at)
	}
	if code, out := post("/subscriptions/"+sub+":seek", map[string]string{"snapshot": "before-rebuild"}); code != 501 || out["message"] != "snapshots are Pub/Sub's; on this transport seek to a time" {
		t.Errorf("seek to a snapshot on NATS: %d %v; want 501 saying to seek to a time", code, out)
	}
	if code, _ := post("/subscriptions/"+sub+":seek", map[string]string{"time": "yesterday"}); code != 400 {
		t.Errorf("seek to an invalid time: %d, want 400", code)
	}
}
