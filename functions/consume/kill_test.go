package consume_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/delivery"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/ledger"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/registry"
	"github.com/relaybus/relaybus/shared/topology"
	"github.com/relaybus/relaybus/shared/transport"
)

// childEnv makes the test binary serve the consume function (instance.Main)
// instead of running tests.
const childEnv = "RELAYBUS_CONSUME_TEST_CHILD"

func runChildIfAsked() {
	if os.Getenv(childEnv) != "" {
		instance.Main("consume")
		os.Exit(0)
	}
}

// A consume process SIGKILLed after its commit and before its ledger write
// (here: its Firestore does not answer, and it is killed once it has
// answered 200): the delivery is not redelivered, the scheduled shipping
// step ships the attempt from Postgres, and the event's status becomes
// final.
func TestKilledBetweenCommitAndLedgerWrite(t *testing.T) {
	if os.Getenv("PUBSUB_EMULATOR_HOST") == "" {
		t.Skip("PUBSUB_EMULATOR_HOST is not set (make test starts the emulator)")
	}
	ctx := context.Background()
	pool, schema := pgtest.SchemaConfig(t, nil)
	project := emutest.FirestoreProject(t)
	top, _ := topology.Load("")
	ps, err := transport.New(ctx, project, transport.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if err := transport.Provision(ctx, ps, top, transport.ProvisionOptions{}); err != nil {
		t.Fatal(err)
	}
	store, err := ledger.Open(ctx, ledger.Config{ProjectID: project}, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := store.SyncConsumers(ctx, registry.Consumers(top), ledger.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	e := &event.Event{Type: "points.added", Source: "member-service", Topic: "member.points.events", AggregateID: "m-9",
		Version: 1, Payload: []byte(`{"balance":10}`)}
	_ = e.Prepare(time.Now(), event.Limits{})
	if err := store.RecordSent(ctx, ledger.SentAt(time.Now(), e)); err != nil {
		t.Fatal(err)
	}

	// The consume process, with a Firestore that never answers.
	dead, _ := net.Listen("tcp", "127.0.0.1:0") // accepts, never speaks gRPC
	defer dead.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "PORT="+strconv.Itoa(port), "FUNCTION_TARGET=",
		"GOOGLE_CLOUD_PROJECT="+project, "DATABASE_URL="+pgtest.SchemaURL(t, schema),
		"FIRESTORE_EMULATOR_HOST="+dead.Addr().String(), "CONSUMER_ID=audit-service", "CONSUMER_HANDLER=projection")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	m, _ := event.Encode(e, event.EncodingJSON)
	m.ID = "msg-9"
	body := delivery.WrappedBody(m, "projects/"+project+"/subscriptions/member.points.events.audit-service-recorder", 1)
	var res consumer.Result
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Post("http://127.0.0.1:"+strconv.Itoa(port), "application/json", bytes.NewReader(body))
		if err == nil {
			_ = json.NewDecoder(resp.Body).Decode(&res)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || res.Outcome != ledger.OutcomeSuccess {
				t.Fatalf("delivery: %d %+v, want 200 success whatever the ledger does", resp.StatusCode, res)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the consume process never answered: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	var unshipped int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_attempts WHERE shipped_at IS NULL`).Scan(&unshipped)
	if unshipped != 1 {
		t.Fatalf("%d unshipped attempts in Postgres after the kill, want 1", unshipped)
	}

	// The scheduled step (another instance's POST /ledger:ship) ships it.
	engine, err := consumer.New(consumer.Options{DB: pool, ConsumerID: "audit-service", Handler: projection.Latest(),
		DeadLetters: ps, Ledger: ledger.NewRecorder(store, ps, top.Rollup.Topic), ShipDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close(ctx)
	h, _ := consume.New(consume.Options{Engine: engine, DB: pool})
	req, _ := http.NewRequest(http.MethodPost, "/ledger:ship", nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var rep consumer.ShipReport
	_ = json.Unmarshal(rec.Body.Bytes(), &rep)
	if rec.Code != 200 || rep.Shipped != 1 {
		t.Fatalf("POST /ledger:ship: %d %s", rec.Code, rec.Body.String())
	}
	// Its notice rolls the event up (the rollup function's store call).
	rs, err := store.RollupMany(ctx, []string{e.ID})
	if err != nil || rs[0].Err != nil || rs[0].Status != ledger.StatusConsumed {
		t.Fatalf("rollup: %+v %v", rs, err)
	}
	var redelivered int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_attempts`).Scan(&redelivered)
	if redelivered != 1 {
		t.Errorf("%d attempts, want the one (no redelivery)", redelivered)
	}
}
