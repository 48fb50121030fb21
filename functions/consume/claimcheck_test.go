package consume

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/publish"
	relayfn "github.com/relaybus/relaybus/functions/relay"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/brokeropen"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

// payloadRecorder is a consumer handler that keeps every payload it was
// handed, by event id.
type payloadRecorder struct {
	mu   sync.Mutex
	seen map[string][]byte
}

func (r *payloadRecorder) Handle(_ context.Context, c *consumer.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen[c.Event.ID] = bytes.Clone(c.Event.Payload)
	return nil
}

func (r *payloadRecorder) get(id string) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[id]
}

var claimRecorder = &payloadRecorder{seen: map[string][]byte{}}

func init() {
	RegisterHandler("claimcheck-test-recorder", func(HandlerConfig) (consumer.Handler, error) { return claimRecorder, nil })
}

// bigJSON is a JSON payload of about n bytes, random, without whitespace.
func bigJSON(t *testing.T, n int) []byte {
	t.Helper()
	raw := make([]byte, n/4*3)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	return []byte(`{"blob":"` + base64.StdEncoding.EncodeToString(raw) + `"}`)
}

// Payloads over Pub/Sub's 10 MB, published by the relay function's drain
// and by the publish function's fast path with CLAIM_CHECK_DIR set, reach
// a consume function (pull mode, built by its one Build, on the Pub/Sub
// emulator) whole, byte for byte, while the messages on Pub/Sub carry a
// reference and no data; a payload under the threshold stays inline.
func TestClaimCheckDeliversLargePayloadsWhole(t *testing.T) {
	ctx := context.Background()
	host := emutest.Host(t, emulator.PubSub)
	project := emutest.UniqueProject(t)
	store := t.TempDir()
	const (
		topic = "shop.blob.events"
		sub   = "shop.blob.events.blob-service-recorder"
		peek  = "shop.blob.events.peek-service-recorder"
	)
	topo := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(topo, []byte(`
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.blob.events
    consumers:
      - service: blob-service
        role: recorder
        handler: projection
      - service: peek-service
        role: recorder
        handler: projection
`), 0o644); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load(topo)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := brokeropen.PubSub(ctx, instance.PubSub{EmulatorHost: host}, project)
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if err := ps.Provision(ctx, top); err != nil {
		t.Fatal(err)
	}
	env := func(e *instance.Env, p *instance.PubSub) {
		e.ProjectID, e.Topology, p.EmulatorHost = project, topo, host
	}

	// The consumer.
	_, consSchema := pgtest.SchemaConfig(t, nil)
	cc := instance.Defaults[Config]()
	env(&cc.Env, &cc.PubSub)
	cc.DB.URL = pgtest.SchemaURL(t, consSchema)
	cc.Ledger.Mode = "off"
	cc.ConsumerID, cc.Subscription, cc.Handler, cc.Mode = "blob-service", sub, "claimcheck-test-recorder", ModePull
	cc.ClaimCheck.Dir = store
	fn, err := Build(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fn.Close(ctx) }()

	// The producers: one outbox, the relay function and the publish
	// function over it.
	prodPool, prodSchema := pgtest.SchemaConfig(t, nil)
	prodURL := pgtest.SchemaURL(t, prodSchema)
	rc := instance.Defaults[relayfn.Config]()
	env(&rc.Env, &rc.PubSub)
	rc.DB.URL, rc.Ledger.Mode, rc.ClaimCheck.Dir = prodURL, "off", store
	relayH, err := relayfn.Build(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = relayH.Close(ctx) }()
	pc := instance.Defaults[publish.Config]()
	env(&pc.Env, &pc.PubSub)
	pc.DB.URL, pc.Ledger.Mode, pc.ClaimCheck.Dir = prodURL, "off", store
	pc.MaxPayloadBytes = 16 << 20
	pc.Budget = time.Minute // a 12 MB write on a busy test machine
	pub, err := publish.Build(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pub.Close(ctx) }()

	// 1. Through the outbox and the relay's drain: a 12 MB JSON payload
	//    and, after it, a 12 MB payload that is not JSON (16 MB once
	//    base64-encoded in the message).
	viaRelay := &event.Event{ID: "blob-relay-1", Type: "blob.stored", Source: "blob-service", Topic: topic,
		AggregateID: "b-1", Version: 1, Payload: bigJSON(t, 12<<20)}
	binary := make([]byte, 12<<20)
	_, _ = rand.Read(binary)
	viaRelayBin := &event.Event{ID: "blob-relay-2", Type: "blob.stored", Source: "blob-service", Topic: topic,
		AggregateID: "b-1", Version: 2, PayloadType: "application/octet-stream", Payload: binary}
	if _, err := outbox.Enqueue(ctx, prodPool, viaRelay, viaRelayBin); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	relayH.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"published":2`) {
		t.Fatalf("relay drain: %d %s", rec.Code, rec.Body)
	}

	// 2. Through publish's fast path: a 12 MB payload and a small one.
	post := func(id string, version int, payload []byte) publish.Result {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"eventId": id, "eventType": "blob.stored", "topic": topic,
			"aggregateId": "b-2", "version": version, "payload": json.RawMessage(payload),
			"initiator": map[string]any{"service": "blob-service"}})
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		pub.ServeHTTP(rec, req)
		var res publish.Result
		_ = json.Unmarshal(rec.Body.Bytes(), &res)
		if rec.Code != http.StatusAccepted || res.Status != publish.StatusPublished {
			t.Fatalf("publish %s: %d %.300s, want 202 published", id, rec.Code, rec.Body)
		}
		return res
	}
	viaFast := bigJSON(t, 12<<20)
	post("blob-fast-1", 1, viaFast)
	small := []byte(`{"blob":"small"}`)
	post("blob-fast-2", 2, small)

	want := map[string][]byte{"blob-relay-1": viaRelay.Payload, "blob-relay-2": binary, "blob-fast-1": viaFast, "blob-fast-2": small}
	eventually.True(t, 60*time.Second, "the consumer handled all four events", func() bool {
		for id := range want {
			if claimRecorder.get(id) == nil {
				return false
			}
		}
		return true
	})
	for id, p := range want {
		if got := claimRecorder.get(id); !bytes.Equal(got, p) {
			t.Errorf("%s: the handler saw %d bytes that differ from the %d published", id, len(got), len(p))
		}
	}

	// What travelled on Pub/Sub: the large ones as references with no
	// data, the small one inline.
	seen := map[string]event.Message{}
	eventually.True(t, 30*time.Second, "the peek subscription has all four messages", func() bool {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		ls, err := ps.Pull(pctx, peek, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			m := l.Message()
			seen[m.Attributes[event.AttrEventID]] = m
			_ = l.Ack(ctx)
		}
		return len(seen) == 4
	})
	for id := range want {
		m := seen[id]
		ref := m.Attributes[event.AttrClaimCheck]
		if id == "blob-fast-2" {
			if ref != "" || !bytes.Contains(m.Data, small) {
				t.Errorf("%s (small): reference %q, %d bytes of data; want inline", id, ref, len(m.Data))
			}
			continue
		}
		if wantRef := fmt.Sprintf("file://%s/%s/%s", filepath.ToSlash(store), topic, id); ref != wantRef || len(m.Data) != 0 {
			t.Errorf("%s: reference %q and %d bytes of data; want %q and none", id, ref, len(m.Data), wantRef)
		}
		if m.Attributes[event.AttrAggregateID] != "b-1" && m.Attributes[event.AttrAggregateID] != "b-2" {
			t.Errorf("%s: the claimed message lost its attributes: %v", id, m.Attributes)
		}
	}
}
