package pgroles_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/examples/shop"
	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/pgbouncer"
	"github.com/relaybus/relaybus/internal/pgcluster"
	"github.com/relaybus/relaybus/internal/pgpool"
	"github.com/relaybus/relaybus/internal/pgroles"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// lines are the migrations the deploy's migrate step applies to every
// database (consume.Migrations) and the demo handlers' tables.
var lines = []migrate.Line{inbox.Migrations, projection.Migrations, outbox.Migrations, shop.Migrations}

// server is a throwaway PostgreSQL cluster that authenticates TCP
// connections with SCRAM-SHA-256 and is set up as Cloud SQL sets up
// relaybus's databases: each database owned by cloudsqlsuperuser, with one
// user per database (relaybus_<name>, what every service used to connect
// as) that is a member of cloudsqlsuperuser with CREATEROLE and CREATEDB,
// as Cloud SQL makes every user its API creates.
type server struct {
	port    int
	super   string
	dir     string
	version int
}

const ownerPassword = "owner-password-0123456789"

var (
	shared    *server
	sharedErr error
	stop      func()
)

// TestMain stops the package's server.
func TestMain(m *testing.M) {
	code := m.Run()
	if stop != nil {
		stop()
	}
	os.Exit(code)
}

// startServer returns the package's server, started by the first test
// that asks (one cluster for the package's tests, which run one at a
// time: each deploy is idempotent).
func startServer(t *testing.T) *server {
	t.Helper()
	if shared == nil && sharedErr == nil {
		shared, sharedErr = newServer()
	}
	if errors.Is(sharedErr, pgcluster.ErrNoBinaries) {
		t.Skip(sharedErr)
	}
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

func newServer() (*server, error) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "relaybus-pgroles-")
	if err != nil {
		return nil, err
	}
	_ = os.Chmod(dir, 0o755) // the server may run as the postgres user
	c, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: filepath.Join(dir, "data"), Password: "superuser-password-0123"})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	stop = func() {
		_ = c.Stop(context.Background())
		_ = os.RemoveAll(dir)
	}
	s := &server{port: c.Port, super: c.URL, dir: dir}
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	for _, st := range []string{
		`CREATE ROLE cloudsqlsuperuser NOLOGIN CREATEROLE CREATEDB`,
		`CREATE ROLE relaybus_main LOGIN CREATEROLE CREATEDB PASSWORD '` + ownerPassword + `' IN ROLE cloudsqlsuperuser`,
		`CREATE ROLE relaybus_member LOGIN CREATEROLE CREATEDB PASSWORD '` + ownerPassword + `' IN ROLE cloudsqlsuperuser`,
		`CREATE DATABASE relaybus_main OWNER cloudsqlsuperuser`,
		`CREATE DATABASE relaybus_member OWNER cloudsqlsuperuser`,
	} {
		if _, err := conn.Exec(ctx, st); err != nil {
			return nil, fmt.Errorf("%s: %w", st, err)
		}
	}
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&s.version); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *server) url(user, password, database string) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable", user, password, s.port, database)
}

func (s *server) connect(t *testing.T, user, password, database string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), s.url(user, password, database))
	if err != nil {
		t.Fatalf("connect as %s to %s: %v", user, database, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// The roles the deploy gives the repository's topology: main is used by
// publish, the relay, dlqreplay and message-service (example.notify);
// member by the relay, dlqreplay and member-service (example.points).
var (
	mainRoles = []pgroles.Role{
		{Name: "relaybus_main_publish", Kind: pgroles.Publish, Password: "publish-password-0123", ConnectionLimit: 100},
		{Name: "relaybus_main_relay", Kind: pgroles.Relay, Password: "relay-password-0123456"},
		{Name: "relaybus_main_dlqreplay", Kind: pgroles.Dlqreplay, Password: "dlqreplay-password-0123"},
		{Name: "relaybus_main_c_notify", Kind: pgroles.Consume, Password: "notify-password-0123456", Tables: []string{"shop_notifications"}},
	}
	memberRoles = []pgroles.Role{
		{Name: "relaybus_member_relay", Kind: pgroles.Relay, Password: "member-relay-password-0"},
		{Name: "relaybus_member_dlqreplay", Kind: pgroles.Dlqreplay, Password: "member-dlq-password-01"},
		{Name: "relaybus_member_c_points", Kind: pgroles.Consume, Password: "points-password-0123456", Tables: []string{"shop_member_points"}},
	}
)

func role(roles []pgroles.Role, name string) pgroles.Role {
	for _, r := range roles {
		if r.Name == name {
			return r
		}
	}
	panic(name)
}

// deploy runs what the deploy's migrate step runs on each database, as its
// owner: the migrations, then the roles.
func (s *server) deploy(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for db, roles := range map[string][]pgroles.Role{"relaybus_main": mainRoles, "relaybus_member": memberRoles} {
		pool, err := pgxpool.New(ctx, s.url(db, ownerPassword, db))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lines {
			if _, err := l.Apply(ctx, pool); err != nil {
				t.Fatalf("%s: migrate %s: %v", db, l.Name, err)
			}
		}
		if err := pgroles.Apply(ctx, pool, roles); err != nil {
			t.Fatalf("%s: %v", db, err)
		}
		pool.Close()
	}
}

// attacks tries, with one credential of the member database, what the
// security review did on PostgreSQL 15, and returns what each attempt
// answered (nil: it worked). Whatever works is rolled back.
func (s *server) attacks(t *testing.T, user, password string) map[string]error {
	t.Helper()
	ctx := context.Background()
	out := map[string]error{}
	own := s.connect(t, user, password, "relaybus_member")
	tx, err := own.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	try := func(name, stmt string) {
		if _, err := tx.Exec(ctx, "SAVEPOINT attack"); err != nil {
			t.Fatal(err)
		}
		_, out[name] = tx.Exec(ctx, stmt)
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT attack"); err != nil {
			t.Fatal(err)
		}
	}
	try("grant itself main's owner role", `GRANT relaybus_main TO `+user)
	try("grant itself publish's role", `GRANT relaybus_main_publish TO `+user)
	try("reset main's owner's password", `ALTER ROLE relaybus_main PASSWORD 'taken-over-0123456'`)
	try("reset publish's password", `ALTER ROLE relaybus_main_publish PASSWORD 'taken-over-0123456'`)
	try("create a role", `CREATE ROLE intruder LOGIN PASSWORD 'intruder-0123456789'`)
	try("create a table", `CREATE TABLE intruder (a int)`)
	try("drop its outbox", `DROP TABLE relaybus_outbox_repush`)
	try("empty its inbox", `TRUNCATE relaybus_inbox`)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := own.Exec(ctx, `CREATE DATABASE intruder`); err == nil {
		out["create a database"] = nil
		_, _ = own.Exec(ctx, `DROP DATABASE intruder`)
	} else {
		out["create a database"] = err
	}
	main, err := pgx.Connect(ctx, s.url(user, password, "relaybus_main"))
	out["connect to main"] = err
	if err != nil {
		out["write main's outbox"] = err
		return out
	}
	defer main.Close(ctx)
	mtx, err := main.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer mtx.Rollback(ctx) //nolint:errcheck
	if _, err := mtx.Exec(ctx, `GRANT relaybus_main TO `+user); err == nil {
		if _, err := mtx.Exec(ctx, `SET LOCAL ROLE relaybus_main`); err != nil {
			t.Fatal(err)
		}
	} else if _, err := mtx.Exec(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	} else if mtx, err = main.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	_, out["write main's outbox"] = mtx.Exec(ctx, `INSERT INTO relaybus_outbox (id, aggregatetype, aggregateid, event_type, version, payload, occurred_at, topic, source, schema_version, payload_type)
		VALUES ('forged', 'order', 'order-42', 'order.purchased', 1, '{}', now(), 'shop.order.events', 'order-service', 'v1', 'application/json')`)
	return out
}

// TestAConsumersCredentialStaysInItsDatabase: the member-service
// consumer's credential cannot reach main's database, cannot take main's
// roles and cannot reset their passwords, nor change its own database's
// schema. The database owner's credential (what every service connected
// as before: Cloud SQL's user, cloudsqlsuperuser with CREATEROLE) does all
// of that on PostgreSQL 15, which is why no service holds it any more.
func TestAConsumersCredentialStaysInItsDatabase(t *testing.T) {
	s := startServer(t)
	s.deploy(t)
	points := role(memberRoles, "relaybus_member_c_points")
	for what, err := range s.attacks(t, points.Name, points.Password) {
		var pe *pgconn.PgError
		if err == nil {
			t.Errorf("the consumer's credential could %s", what)
		} else if !errors.As(err, &pe) || (pe.Code != "42501" && pe.Code != "2BP01") {
			t.Errorf("%s: %v, want permission denied (42501)", what, err)
		}
	}

	// The owner's credential: the review's finding, reproduced on this
	// server when it is older than PostgreSQL 16.
	owner := s.attacks(t, "relaybus_member", ownerPassword)
	for _, what := range []string{"grant itself main's owner role", "reset main's owner's password", "connect to main", "write main's outbox", "create a role"} {
		switch err := owner[what]; {
		case s.version < 160000 && err != nil:
			t.Errorf("PostgreSQL %d: the owner's credential could not %s (%v): the finding no longer reproduces, so this test proves nothing", s.version, what, err)
		case s.version >= 160000:
			t.Logf("PostgreSQL %d: the owner's credential: %s: %v", s.version, what, err)
		}
	}
}

// TestEachRoleHasOnlyItsPrivileges: each role can do what its function
// does and nothing next to it; every role is plain (no attribute, no
// membership); applying again takes back a privilege granted by hand.
func TestEachRoleHasOnlyItsPrivileges(t *testing.T) {
	s := startServer(t)
	s.deploy(t)
	ctx := context.Background()
	insertOutbox := `INSERT INTO relaybus_outbox (id, aggregatetype, aggregateid, event_type, version, payload, occurred_at, topic, source, schema_version, payload_type)
		VALUES ('e-1', 'order', 'order-1', 'order.purchased', 1, '{}', now(), 'shop.order.events', 'order-service', 'v1', 'application/json')`
	cases := []struct {
		role, database, stmt string
		allowed              bool
	}{
		{"relaybus_main_publish", "relaybus_main", insertOutbox, true},
		{"relaybus_main_publish", "relaybus_main", `UPDATE relaybus_outbox_dispatch SET due_at = now()`, true},
		{"relaybus_main_publish", "relaybus_main", `DELETE FROM relaybus_outbox`, false},
		{"relaybus_main_publish", "relaybus_main", `SELECT count(*) FROM relaybus_inbox`, false},
		{"relaybus_main_publish", "relaybus_main", `SELECT count(*) FROM shop_notifications`, false},
		{"relaybus_main_publish", "relaybus_main", `SELECT count(*) FROM relaybus_outbox_backlog`, true},
		{"relaybus_main_relay", "relaybus_main", `DELETE FROM relaybus_outbox`, true},
		{"relaybus_main_relay", "relaybus_main", `SELECT count(*) FROM relaybus_attempts`, false},
		{"relaybus_main_relay", "relaybus_main", `TRUNCATE relaybus_outbox`, false},
		// The history's partitions: made and dropped through the owner's function only.
		{"relaybus_main_relay", "relaybus_main", `SELECT count(*) FROM relaybus_outbox_history_partitions(now(), now() + interval '2 months', now() + interval '10 years')`, true},
		{"relaybus_main_relay", "relaybus_main", `SELECT count(*) FROM relaybus_outbox_history`, true},
		{"relaybus_main_relay", "relaybus_main", `DROP TABLE relaybus_outbox_history`, false},
		{"relaybus_main_dlqreplay", "relaybus_main", `INSERT INTO relaybus_outbox_backfill (id, topic, consumer, since, until, rate) VALUES ('b', 't', 'c', now(), now(), 1)`, true},
		{"relaybus_main_dlqreplay", "relaybus_main", `DELETE FROM relaybus_inbox WHERE consumer_id = 'x'`, true},
		{"relaybus_main_dlqreplay", "relaybus_main", `INSERT INTO relaybus_strict_skipped (consumer_id, aggregate_type, aggregate_id, version) VALUES ('c', 'a', 'i', 1)`, true},
		{"relaybus_main_dlqreplay", "relaybus_main", `DELETE FROM relaybus_outbox`, false},
		{"relaybus_main_dlqreplay", "relaybus_main", `SELECT count(*) FROM shop_notifications`, false},
		{"relaybus_main_c_notify", "relaybus_main", `INSERT INTO shop_notifications (event_id, order_id, member_id) VALUES ('e', 'o', 'm')`, true},
		{"relaybus_main_c_notify", "relaybus_main", `SELECT count(*) FROM shop_member_points`, false},
		{"relaybus_main_c_notify", "relaybus_main", insertOutbox, true},
		{"relaybus_main_c_notify", "relaybus_main", `DELETE FROM relaybus_outbox`, false},
		{"relaybus_main_c_notify", "relaybus_main", `INSERT INTO relaybus_migrations (line, version, name) VALUES ('x', 1, 'x')`, false},
		{"relaybus_member_c_points", "relaybus_member", `INSERT INTO shop_member_points (member_id, points, version) VALUES ('m', 1, 1)`, true},
		{"relaybus_member_c_points", "relaybus_member", `SELECT count(*) FROM shop_notifications`, false},
		{"relaybus_member_c_points", "relaybus_member", `CREATE TEMP TABLE scratch (a int)`, false},
	}
	all := append(append([]pgroles.Role{}, mainRoles...), memberRoles...)
	for _, c := range cases {
		conn := s.connect(t, c.role, role(all, c.role).Password, c.database)
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(ctx, c.stmt)
		_ = tx.Rollback(ctx)
		if c.allowed && err != nil {
			t.Errorf("%s may not %s: %v", c.role, c.stmt, err)
		}
		if !c.allowed && err == nil {
			t.Errorf("%s may %s", c.role, c.stmt)
		}
	}
	// Every role of a database is refused by the other.
	for _, r := range mainRoles {
		if _, err := pgx.Connect(ctx, s.url(r.Name, r.Password, "relaybus_member")); err == nil || !strings.Contains(err.Error(), "permission denied for database") {
			t.Errorf("%s connects to relaybus_member: %v", r.Name, err)
		}
	}
	super := s.connect(t, "postgres", "superuser-password-0123", "postgres")
	check := func() {
		t.Helper()
		rows, _ := super.Query(ctx, `SELECT r.rolname, r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolbypassrls,
			(SELECT count(*) FROM pg_auth_members m WHERE m.member = r.oid), r.rolconnlimit
			FROM pg_roles r WHERE r.rolname LIKE 'relaybus\_%\_%' ESCAPE '\' ORDER BY 1`)
		n := 0
		for rows.Next() {
			var name string
			var privileged bool
			var members, limit int
			if err := rows.Scan(&name, &privileged, &members, &limit); err != nil {
				t.Fatal(err)
			}
			n++
			if privileged || members != 0 {
				t.Errorf("%s: privileged attributes %v, member of %d roles", name, privileged, members)
			}
			if want := role(all, name).ConnectionLimit; (want == 0 && limit != -1) || (want > 0 && limit != want) {
				t.Errorf("%s: connection limit %d, want %d", name, limit, want)
			}
		}
		if n != len(all) {
			t.Errorf("%d roles, want %d", n, len(all))
		}
	}
	check()

	// A privilege granted by hand, and an attribute and a membership an
	// old role carried, are gone after the next deploy.
	owner := s.connect(t, "relaybus_main", ownerPassword, "relaybus_main")
	for _, st := range []string{`GRANT DELETE ON relaybus_outbox TO relaybus_main_publish`, `ALTER ROLE relaybus_main_c_notify CREATEDB`, `GRANT relaybus_main_relay TO relaybus_main_c_notify`} {
		if _, err := owner.Exec(ctx, st); err != nil {
			t.Fatalf("%s: %v", st, err)
		}
	}
	s.deploy(t)
	check()
	conn := s.connect(t, "relaybus_main_publish", role(mainRoles, "relaybus_main_publish").Password, "relaybus_main")
	if _, err := conn.Exec(ctx, `DELETE FROM relaybus_outbox`); err == nil {
		t.Error("publish kept a DELETE granted by hand")
	}
}

// TestRolesRunTheHotPathsThroughPgBouncer: each function, under its own
// role and through PgBouncer in transaction mode (SCRAM to the client and
// to the server), starts (its migrations checked, not applied) and runs
// its hot path: publish enqueues and publishes at once, the member
// consumer applies an order, writes its points and emits and kicks its
// child, the relay drains, dlqreplay clears a consumer for a rebuild. A
// role whose database lacks a migration is told to run the migrate step.
func TestRolesRunTheHotPathsThroughPgBouncer(t *testing.T) {
	s := startServer(t)
	s.deploy(t)
	ctx := context.Background()
	users := map[string]string{}
	for _, r := range append(append([]pgroles.Role{}, mainRoles...), memberRoles...) {
		users[r.Name] = r.Password
	}
	b, err := pgbouncer.Start(ctx, pgbouncer.Options{ServerURL: s.super, Dir: filepath.Join(s.dir, "pgbouncer"), Users: users})
	if errors.Is(err, pgbouncer.ErrNoBinary) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop(context.Background()) })
	pooled := func(r pgroles.Role, database string) *pgpool.Pool {
		t.Helper()
		url := fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/%s?sslmode=disable&default_query_exec_mode=exec", r.Name, r.Password, b.Port, database)
		p, err := pgpool.Open(ctx, pgpool.Config{URL: url}, lines...)
		if err != nil {
			t.Fatalf("%s starts: %v", r.Name, err)
		}
		t.Cleanup(p.Close)
		return p
	}
	top, err := topology.Load("../../infra/topology.yaml")
	if err != nil {
		t.Fatal(err)
	}
	fake := pubsubtest.New(t)
	fake.Provision(t, top)

	// publish: enqueue and publish at once.
	pub, err := relay.New(relay.Options{DB: pooled(role(mainRoles, "relaybus_main_publish"), "relaybus_main"), Publisher: fake.Client, Topology: top})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	order := &event.Event{ID: "evt-order-1", Type: "order.purchased", Source: "order-service", Topic: "shop.order.events",
		AggregateType: "order", AggregateID: "order-1", Version: 1, Payload: []byte(`{"orderId": "order-1", "memberId": "m-1", "amount": 42}`)}
	if err := order.Prepare(time.Now(), event.Limits{}); err != nil {
		t.Fatal(err)
	}
	enq, claim, err := pub.EnqueueNow(ctx, order)
	if err != nil || len(enq) != 1 {
		t.Fatalf("publish enqueues: %v %v", enq, err)
	}
	states, err := pub.PublishClaimed(ctx, claim)
	if err != nil || states[order.ID] != outbox.StatePublished {
		t.Fatalf("publish publishes: %v %v", states, err)
	}

	// member-service: applies the order, emits its child, kicks it.
	memberDB := pooled(role(memberRoles, "relaybus_member_c_points"), "relaybus_member")
	kicker, err := relay.New(relay.Options{DB: memberDB, Publisher: fake.Client, Topology: top})
	if err != nil {
		t.Fatal(err)
	}
	defer kicker.Close(ctx)
	eng, err := consumer.New(consumer.Options{DB: memberDB, ConsumerID: "member-service", Handler: shop.Points(), DeadLetters: fake.Client,
		Kicker: kicker, Emits: []string{"member.points.events"}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cloudevent.Encode(order, event.EncodingJSON)
	if err != nil {
		t.Fatal(err)
	}
	m.ID, m.DeliveryAttempt, m.PublishTime = "m-1", 1, time.Now()
	if r := eng.Handle(ctx, delivery.Delivery{Mode: delivery.ModePush, Subscription: "shop.order.events.member-service-processor", Message: m}); r.Outcome != "success" {
		t.Fatalf("member-service: %+v", r)
	}
	if err := kicker.FlushKicks(ctx); err != nil {
		t.Fatal(err)
	}
	var points int
	var published bool
	if err := memberDB.QueryRow(ctx, `SELECT points FROM shop_member_points WHERE member_id = 'm-1'`).Scan(&points); err != nil || points != 42 {
		t.Errorf("points %d, %v", points, err)
	}
	if err := memberDB.QueryRow(ctx, `SELECT published_version >= 1 FROM relaybus_outbox_dispatch WHERE aggregatetype = 'member' AND aggregateid = 'm-1'`).Scan(&published); err != nil || !published {
		t.Errorf("the child event was not published by the kick: %v %v", published, err)
	}

	// The relay drains each database; dlqreplay clears a rebuild.
	for _, r := range []struct {
		role pgroles.Role
		db   string
	}{{role(mainRoles, "relaybus_main_relay"), "relaybus_main"}, {role(memberRoles, "relaybus_member_relay"), "relaybus_member"}} {
		rl, err := relay.New(relay.Options{DB: pooled(r.role, r.db), Publisher: fake.Client, Topology: top})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rl.Drain(ctx, 10*time.Second); err != nil {
			t.Errorf("%s drains: %v", r.role.Name, err)
		}
		_ = rl.Close(ctx)
	}
	dlq := pooled(role(memberRoles, "relaybus_member_dlqreplay"), "relaybus_member")
	if n, err := inbox.ClearForRebuild(ctx, dlq, "member-service", false); err != nil || n != 1 {
		t.Errorf("dlqreplay clears member-service's inbox: %d, %v", n, err)
	}

	// A migration the owner has not applied: the role is told so.
	owner := s.connect(t, "relaybus_member", ownerPassword, "relaybus_member")
	if _, err := owner.Exec(ctx, `DELETE FROM relaybus_migrations WHERE line = 'outbox' AND version = 4`); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := owner.Exec(ctx, `INSERT INTO relaybus_migrations (line, version, name) VALUES ('outbox', 4, 'traceparent')`); err != nil {
			t.Fatal(err)
		}
	}()
	url := fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/relaybus_member?sslmode=disable&default_query_exec_mode=exec",
		"relaybus_member_relay", role(memberRoles, "relaybus_member_relay").Password, b.Port)
	if _, err := pgpool.Open(ctx, pgpool.Config{URL: url}, outbox.Migrations); !errors.Is(err, migrate.ErrNotOwner) {
		t.Errorf("a role facing an unapplied migration: %v, want migrate.ErrNotOwner", err)
	}
}
