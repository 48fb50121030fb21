package consume_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/ledger/model"

	"cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/fnproc"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/broker"
	brokerpubsub "github.com/relaybus/relaybus/shared/broker/pubsub"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/forward"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/topology"
)

// A consume process SIGKILLed after its commit and before its ledger write
// (here: its Firestore and its Pub/Sub, which carries the rollup notices,
// do not answer, and it is killed once it has answered 200): the delivery is not redelivered, the scheduled shipping
// step ships the attempt from Postgres, and the event's status becomes
// final.
func TestKilledBetweenCommitAndLedgerWrite(t *testing.T) {
	emutest.Host(t, emulator.PubSub) // make test's, or one started for the test binary
	ctx := context.Background()
	pool, schema := pgtest.SchemaConfig(t, nil)
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
	if _, err := consumers.New(store.Client(), consumers.Options{}).SyncConsumers(ctx, registry.Consumers(top), consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	e := &event.Event{Type: "points.added", Source: "member-service", Topic: "member.points.events", AggregateID: "m-9",
		Version: 1, Payload: []byte(`{"balance":10}`)}
	_ = e.Prepare(time.Now(), event.Limits{})
	if err := store.RecordSent(ctx, model.SentAt(time.Now(), e)); err != nil {
		t.Fatal(err)
	}

	// The consume process, with a Firestore that never answers.
	dead, _ := net.Listen("tcp", "127.0.0.1:0") // accepts, never speaks gRPC
	defer dead.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fnproc.Env("consume"), "PORT="+strconv.Itoa(port), "FUNCTION_TARGET=",
		"GOOGLE_CLOUD_PROJECT="+project, "DATABASE_URL="+pgtest.SchemaURL(t, schema),
		"FIRESTORE_EMULATOR_HOST="+dead.Addr().String(), "PUBSUB_EMULATOR_HOST="+dead.Addr().String(),
		"CONSUMER_ID=audit-service", "CONSUMER_HANDLER=projection")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	m, _ := cloudevent.Encode(e, event.EncodingJSON)
	m.ID = "msg-9"
	body := delivery.WrappedBody(m, "projects/"+project+"/subscriptions/member.points.events.audit-service-recorder", 1)
	var res consumer.Result
	eventually.True(t, 30*time.Second, "the consume process answering", func() bool {
		resp, err := http.Post("http://127.0.0.1:"+strconv.Itoa(port), "application/json", bytes.NewReader(body))
		if err != nil {
			return false
		}
		_ = json.NewDecoder(resp.Body).Decode(&res)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || res.Outcome != model.OutcomeSuccess {
			t.Fatalf("delivery: %d %+v, want 200 success whatever the ledger does", resp.StatusCode, res)
		}
		return true
	})
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	var unshipped int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_inbox_unshipped`).Scan(&unshipped)
	if unshipped != 1 {
		t.Fatalf("%d unshipped attempts in Postgres after the kill, want 1", unshipped)
	}

	// The scheduled step (another instance's POST /ledger:ship) ships it.
	engine, err := consumer.New(consumer.Options{DB: pool, ConsumerID: "audit-service", Handler: projection.Latest(),
		DeadLetters: ps, Ledger: ledger.NewRecorder(ps, ledger.RecorderOptions{Topic: top.Rollup.Topic}), ShipDelay: time.Millisecond})
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
	n := rollupNotice(t, ps, broker.RollupSubscription(top), e.ID)
	rs, err := store.Fold(ctx, []model.Notice{n}, 0)
	if err != nil || rs[0].Err != nil || rs[0].Status != model.StatusConsumed {
		t.Fatalf("rollup: %+v %v", rs, err)
	}
	var redelivered int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_attempts`).Scan(&redelivered)
	if redelivered != 1 {
		t.Errorf("%d attempts, want the one (no redelivery)", redelivered)
	}
}

// startChild starts the consume function in a child process with env on a
// free port and returns its URL; the process is killed at cleanup.
func startChild(t *testing.T, env ...string) (*exec.Cmd, string) {
	t.Helper()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), fnproc.Env("consume"), "PORT="+strconv.Itoa(port), "FUNCTION_TARGET="), env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, "http://127.0.0.1:" + strconv.Itoa(port)
}

// postWhenUp POSTs body to url, retrying while nothing listens there yet
// (the child is starting), and returns the answer or the error that
// ended the request (a killed child's broken connection).
func postWhenUp(url string, body []byte, deadline time.Time) (int, consumer.Result, error) {
	for {
		resp, err := http.Post(url, "application/json", bytes.NewReader(body))
		if err == nil {
			var res consumer.Result
			_ = json.NewDecoder(resp.Body).Decode(&res)
			resp.Body.Close()
			return resp.StatusCode, res, nil
		}
		if !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
			return 0, consumer.Result{}, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A forward consumer's process SIGKILLed after the target answered 200
// and before the process recorded the outcome (the test holds the claim's
// row lock while the target answers, waits until the process's record
// statement is blocked on it, kills the process and ends its database
// session, so the record never runs): the claim it committed before the
// call stands, so the event is neither lost nor taken for applied.
// Redelivered (to another process, as Pub/Sub would), it is refused with
// 503 while the claim's lease lasts, then the claim is taken over: the
// target is called once more, which it deduplicates on the event id, the
// outcome is recorded once, the killed attempt is recorded as abandoned,
// and later deliveries are duplicates.
func TestKilledAfterTheForwardCallBeforeItsRecord(t *testing.T) {
	emutest.Host(t, emulator.PubSub) // make test's, or one started for the test binary
	ctx := context.Background()
	pool, schema := pgtest.SchemaConfig(t, nil)
	secret := forward.NewSecret()
	tg := newForwardTarget(t, secret)
	answered := make(chan error, 1)
	var lock pgx.Tx
	var once sync.Once
	tg.setHold(func(r *http.Request) {
		once.Do(func() { // the first call: lock the claim's row, then answer 200
			tx, err := pool.Begin(ctx)
			if err == nil {
				var state string
				err = tx.QueryRow(ctx, `SELECT state FROM relaybus_inbox WHERE event_id = $1 FOR UPDATE`, r.Header.Get("webhook-id")).Scan(&state)
				if err == nil && state != "claimed" {
					err = fmt.Errorf("the row is %s during the call, want the committed claim", state)
				}
			}
			lock = tx
			answered <- err
		})
	})
	env := []string{"GOOGLE_CLOUD_PROJECT=" + fmt.Sprintf("consume-kill-%d", time.Now().UnixNano()),
		"DATABASE_URL=" + pgtest.SchemaURL(t, schema), "LEDGER=off", "CONSUMER_ID=archive-service",
		"CONSUMER_HANDLER=forward", "FORWARD_URL=" + tg.URL, "FORWARD_AUTH=hmac", "FORWARD_SIGNING_SECRET=" + secret,
		"FORWARD_TIMEOUT=1s"}
	e := &event.Event{Type: "points.added", Source: "member-service", Topic: "member.points.events", AggregateID: "m-7",
		Version: 1, Payload: []byte(`{"balance":70}`)}
	_ = e.Prepare(time.Now(), event.Limits{})
	m, _ := cloudevent.Encode(e, event.EncodingJSON)
	m.ID = "msg-7"
	deliver := func(attempt int) []byte {
		return delivery.WrappedBody(m, "projects/p/subscriptions/member.points.events.archive-service-processor", attempt)
	}

	first, url := startChild(t, env...)
	go func() { _, _, _ = postWhenUp(url, deliver(1), time.Now().Add(30*time.Second)) }()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first process never called the target")
	}
	defer lock.Rollback(ctx) //nolint:errcheck
	var lockPID, recorder int
	if err := lock.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&lockPID); err != nil {
		t.Fatal(err)
	}
	// The target has answered 200; the process's record waits on our lock.
	eventually.True(t, 30*time.Second, "the process trying to record the outcome (blocked on the test's lock)", func() bool {
		return pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, lockPID).Scan(&recorder) == nil
	})
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	// Its connection dies with it: the record never runs.
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, recorder); err != nil {
		t.Fatal(err)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	count := func(q string) int {
		var n int
		if err := pool.QueryRow(ctx, q, e.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(`SELECT count(*) FROM relaybus_inbox WHERE event_id = $1 AND state = 'claimed'`); n != 1 {
		t.Fatalf("after the kill: %d claims, want the committed one", n)
	}
	if n := count(`SELECT count(*) FROM relaybus_attempts WHERE event_id = $1`); n != 0 {
		t.Fatalf("after the kill: %d attempts recorded, want none (killed before the record)", n)
	}

	// Pub/Sub redelivers; another instance answers.
	_, url = startChild(t, env...)
	deadline := time.Now().Add(30 * time.Second)
	var code int
	var res consumer.Result
	refused := 0
	for attempt := 2; ; attempt++ {
		var err error
		code, res, err = postWhenUp(url, deliver(attempt), deadline)
		if err != nil {
			t.Fatal(err)
		}
		if code != http.StatusServiceUnavailable || res.Code != "in_progress" {
			break
		}
		refused++
		if n := tg.calls.Load(); n != 1 {
			t.Fatalf("the target was called %d times while the claim's lease lasted, want 1", n)
		}
		if time.Now().After(deadline) {
			t.Fatal("the claim was never taken over")
		}
		time.Sleep(200 * time.Millisecond)
	}
	if code != 200 || res.Outcome != model.OutcomeSuccess {
		t.Fatalf("redelivery after the lease: %d %+v, want 200 success", code, res)
	}
	if n, effects := tg.calls.Load(), tg.effectCount(); n != 2 || effects != 1 {
		t.Errorf("the target was called %d times with %d effects, want 2 calls (once more) and 1 effect", n, effects)
	}
	if n := count(`SELECT count(*) FROM relaybus_attempts WHERE event_id = $1 AND outcome = 'success'`); n != 1 {
		t.Errorf("%d success attempts recorded, want 1", n)
	}
	if n := count(`SELECT count(*) FROM relaybus_attempts WHERE event_id = $1 AND outcome = 'retry' AND error_code = 'abandoned' AND attempt_no = 1`); n != 1 {
		t.Errorf("the killed attempt is not recorded as abandoned")
	}
	if n := count(`SELECT count(*) FROM relaybus_inbox WHERE event_id = $1 AND state = 'applied'`); n != 1 {
		t.Errorf("the inbox row is not applied")
	}
	if code, res, err := postWhenUp(url, deliver(99), deadline); err != nil || code != 200 || !res.Duplicate {
		t.Errorf("a later delivery: %d %+v %v, want a duplicate", code, res, err)
	}
	if n := tg.calls.Load(); n != 2 {
		t.Errorf("the target was called %d times in all, want 2", n)
	}
	t.Logf("%d redeliveries refused while the killed process's claim was leased", refused)
}

// rollupNotice waits for the rollup notice that names eventID on sub.
func rollupNotice(t *testing.T, ps *brokerpubsub.Client, sub, eventID string) model.Notice {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out model.Notice
	_ = ps.PubSub().Subscriber(sub).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		ns, _ := model.ReadNotice(event.Message{ID: m.ID, Data: m.Data, Attributes: m.Attributes})
		for _, n := range ns {
			if n.EventID == eventID {
				out = n
				cancel()
			}
		}
	})
	if out.EventID == "" {
		t.Fatalf("no rollup notice for %s within 20s", eventID)
	}
	return out
}
