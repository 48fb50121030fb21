package relay_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// plainInsert is the statement docs/producing.md gives producers that do
// not use relaybus's Go code ("Producing from any language"): one event,
// its payload a JSON text.
const plainInsert = `INSERT INTO relaybus_outbox (id, aggregatetype, aggregateid, event_type, version, payload,
    occurred_at, topic, source, schema_version, payload_type)
VALUES ($1, $2, $3, $4, $5, convert_to($6, 'UTF8'), now(), $7, $8, $9, 'application/json')`

// A producer in another language writes the outbox with a plain INSERT;
// the relay publishes those rows in version order together with the
// versions of the same aggregates enqueued through Go, one statement or
// many, whether the relay drains while they are written or after.
func TestPlainSQLInsertsArePublishedInOrderBetweenGoEnqueues(t *testing.T) {
	const aggregates, versions = 40, 12
	ctx := context.Background()
	doc, err := os.ReadFile("../../docs/producing.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), plainInsert) {
		t.Fatalf("docs/producing.md does not give the statement this test runs:\n%s", plainInsert)
	}
	e := newEnv(t)
	// Any driver: the simple query protocol, as psql or a driver without
	// prepared statements sends it, on a connection of its own.
	cfg := e.pool.Config().ConnConfig.Copy()
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	plain, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)

	r := e.relay(t, relay.Options{BatchSize: 50, Aggregates: 10, RunLimit: 5})
	drained := make(chan error, 1)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				drained <- nil
				return
			default:
			}
			if _, err := r.Drain(ctx, 5*time.Second); err != nil {
				drained <- err
				return
			}
		}
	}()
	for v := int64(1); v <= versions; v++ {
		switch v % 3 {
		case 0: // Go, one transaction for every aggregate's version v
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for a := range aggregates {
				if _, err := outbox.Enqueue(ctx, tx, ev(aggKey(a), v)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		case 1: // plain SQL, one autocommit statement per event
			for a := range aggregates {
				if _, err := plain.Exec(ctx, plainInsert, fmt.Sprintf("%s-v%d", aggKey(a), v), "order", aggKey(a),
					"order.purchased", v, `{"n":1}`, topic, "billing-service", "v1"); err != nil {
					t.Fatalf("plain insert: %v", err)
				}
			}
		case 2: // plain SQL, one multi-row statement in a transaction
			tx, err := plain.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var b pgx.Batch
			for a := range aggregates {
				b.Queue(plainInsert, fmt.Sprintf("%s-v%d", aggKey(a), v), "order", aggKey(a),
					"order.purchased", v, `{"n":1}`, topic, "billing-service", "v1")
			}
			if err := tx.SendBatch(ctx, &b).Close(); err != nil {
				t.Fatalf("plain batch: %v", err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	waitDrained(t, r, e.pool)
	e.rec.checkExactlyInOrder(t, aggregates, versions)
}

// The Python example in docs/producing.md, run as written with psycopg 3
// (Debian's python3-psycopg under /usr/bin/python3; .ci/run installs it), inside a loop that
// writes three versions of one order: the relay publishes all three, in
// order.
func TestThePythonProducerExampleIsPublished(t *testing.T) {
	doc, err := os.ReadFile("../../docs/producing.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "Python (psycopg 3)")
	if ok {
		_, rest, ok = strings.Cut(rest, "```python\n")
	}
	example, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/producing.md has no Python example after \"Python (psycopg 3)\"")
	}
	var indented strings.Builder
	for _, line := range strings.Split(strings.TrimRight(example, "\n"), "\n") {
		indented.WriteString("    " + line + "\n")
	}
	script := `import json, os, psycopg
# The test's schema (through PgBouncer the database's own default instead:
# it refuses an options parameter); no server-side prepares behind a
# transaction-mode pooler.
kw = {"options": "-c search_path=" + os.environ["SCHEMA"]} if os.environ.get("SCHEMA") else {}
conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True, prepare_threshold=None, **kw)
conn.execute("CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL DEFAULT 'new')")
conn.execute("INSERT INTO orders (id) VALUES ('order-py')")
for version in (1, 2, 3):
    order_id, event_id, payload = "order-py", "py-%d" % version, {"amount": 42, "version": version}
` + indented.String()

	e := newEnv(t)
	url := e.pool.Config().ConnString()
	schema := e.pool.Config().ConnConfig.RuntimeParams["search_path"]
	// Debian's interpreter, where Debian's psycopg is (a pyenv or venv
	// python3 first on PATH would not have it).
	const python = "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("%s is required, with psycopg 3 (Debian: python3-psycopg; .ci/run installs it): %v", python, err)
	}
	cmd := exec.Command(python, "-c", script)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+libpqURL(url), "SCHEMA="+schema)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Python example failed: %v\n%s\nscript:\n%s", err, out, script)
	}
	r := e.relay(t, relay.Options{})
	waitDrained(t, r, e.pool)
	if got := e.rec.versions("order-py"); !slices.Equal(got, []int64{1, 2, 3}) {
		t.Fatalf("order-py published versions %v, want [1 2 3]", got)
	}
}

// libpqURL drops the pgx-only parameters of a pgx connection string, so
// libpq (psycopg) accepts it.
func libpqURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	q := u.Query()
	for k := range q {
		if k != "sslmode" {
			q.Del(k)
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
}
