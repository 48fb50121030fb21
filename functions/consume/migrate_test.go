package consume_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	_ "github.com/relaybus/relaybus/examples/shop"
	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/pgroles"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/projection"
)

// untabled is a handler with a table of its own that does not name it.
type untabled struct{ consumer.Handler }

func (untabled) Migrate(ctx context.Context, db migrate.Beginner) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS untabled_things (id text PRIMARY KEY)`); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

var registerUntabled sync.Once

const migrateTopology = `
rollup: {topic: relaybus.ledger.rollup}
databases:
  - name: main
  - name: member
topics:
  - name: shop.order.events
    consumers:
      - service: member-service
        handler: example.points
        database: member
      - service: message-service
        handler: example.notify
      - service: audit-service
        role: recorder
        handler: strict
        database: member
`

// TestMigrateStepGivesEachUserItsRole: `consume migrate` on a database
// applies the migrations and each consumer's handler's tables, and gives
// every function and consumer of that database a role of its own, a
// consumer's role reaching its handler's tables and no other's. Roles that
// do not belong on the database, and a handler whose tables have no
// names, are refused before anything is changed.
func TestMigrateStepGivesEachUserItsRole(t *testing.T) {
	registerUntabled.Do(func() {
		consume.RegisterHandler("test.untabled", func(consume.HandlerConfig) (consumer.Handler, error) {
			return untabled{projection.Latest()}, nil
		})
	})
	ctx := context.Background()
	dir := t.TempDir()
	topo := filepath.Join(dir, "topology.yaml")
	if err := os.WriteFile(topo, []byte(migrateTopology), 0o644); err != nil {
		t.Fatal(err)
	}
	url := pgtest.Database(t)
	var b [3]byte
	_, _ = rand.Read(b[:])
	prefix := "t" + hex.EncodeToString(b[:]) + "_"
	roles := []pgroles.Role{
		{Name: prefix + "relay", Kind: pgroles.Relay, Password: "relay-password-0123456"},
		{Name: prefix + "dlqreplay", Kind: pgroles.Dlqreplay, Password: "dlqreplay-password-0123"},
		{Name: prefix + "points", Kind: pgroles.Consume, Consumer: "shop.order.events.member-service-processor", Password: "points-password-0123456"},
		{Name: prefix + "audit", Kind: pgroles.Consume, Consumer: "shop.order.events.audit-service-recorder", Password: "audit-password-01234567"},
		// The forwarders service (infra/terraform/forwarders.tf): a consume
		// role that names no subscription.
		{Name: prefix + "forwarders", Kind: pgroles.Consume, Consumer: consume.ForwardersConsumer, Password: "forwarders-password-012"},
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), pgtest.URL(t))
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		for _, r := range roles {
			_, _ = conn.Exec(context.Background(), "DROP ROLE IF EXISTS "+pgx.Identifier{r.Name}.Sanitize())
		}
	})
	cfg := func(roles []pgroles.Role) consume.MigrateConfig {
		b, _ := json.Marshal(roles)
		c := consume.MigrateConfig{DB: instance.Database{URL: url}, Database: "member", Roles: string(b)}
		c.Topology = topo
		return c
	}

	// Refused: roles that do not belong here.
	for _, bad := range []struct {
		roles []pgroles.Role
		want  string
	}{
		{[]pgroles.Role{{Name: prefix + "publish", Kind: pgroles.Publish, Password: "publish-password-0123"}}, "publish writes the main database's outbox only"},
		{[]pgroles.Role{{Name: prefix + "notify", Kind: pgroles.Consume, Consumer: "shop.order.events.message-service-processor", Password: "notify-password-0123456"}}, "must be the subscription of a consumer whose database is member"},
		{[]pgroles.Role{roles[0], {Name: prefix + "relay2", Kind: pgroles.Relay, Password: "relay-password-0123456"}}, "one role per function and consumer (relay)"},
		{[]pgroles.Role{roles[4], {Name: prefix + "forwarders2", Kind: pgroles.Consume, Consumer: consume.ForwardersConsumer, Password: "forwarders-password-012"}}, "one role per function and consumer (consume forwarders)"},
	} {
		if _, err := consume.MigrateDatabase(ctx, cfg(bad.roles)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: %v, want %q", bad.roles, err, bad.want)
		}
	}

	rep, err := consume.MigrateDatabase(ctx, cfg(roles))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(rep.Handlers, ",") != "example.points" || len(rep.Roles) != 5 {
		t.Errorf("report %+v", rep)
	}
	for _, c := range []struct {
		role, stmt string
		allowed    bool
	}{
		{"points", `SELECT count(*) FROM shop_member_points`, true},
		{"points", `SELECT count(*) FROM shop_notifications`, false},
		{"audit", `SELECT count(*) FROM relaybus_strict_parked`, true},
		{"audit", `SELECT count(*) FROM shop_member_points`, false},
		{"relay", `DELETE FROM relaybus_outbox`, true},
		{"relay", `SELECT count(*) FROM relaybus_inbox`, false},
		// The forwarders' registry: dlqreplay writes it, the forwarders
		// service reads it and keeps its forwarders' inbox and attempts;
		// no handler's tables.
		{"dlqreplay", `INSERT INTO relaybus_inbox_forwarders (name, topic, url) VALUES ('crm-webhook', 'shop.order.events', 'https://crm.example.com/hooks')`, true},
		{"forwarders", `SELECT count(*) FROM relaybus_inbox_forwarders`, true},
		{"forwarders", `SELECT count(*) FROM relaybus_attempts`, true},
		{"forwarders", `SELECT count(*) FROM shop_member_points`, false},
	} {
		u, err := neturl.Parse(url)
		if err != nil {
			t.Fatal(err)
		}
		u.User = neturl.User(prefix + c.role) // the test server trusts its clients
		conn, err := pgx.Connect(ctx, u.String())
		if err != nil {
			t.Fatalf("connect as %s: %v", c.role, err)
		}
		_, err = conn.Exec(ctx, c.stmt)
		conn.Close(ctx)
		if (err == nil) != c.allowed {
			t.Errorf("%s: %s: %v, want allowed %v", c.role, c.stmt, err, c.allowed)
		}
	}

	// A handler with a table it does not name cannot get a role.
	if err := os.WriteFile(topo, []byte(strings.Replace(migrateTopology, "handler: example.points", "handler: test.untabled", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := consume.MigrateDatabase(ctx, cfg(roles)); err == nil || !strings.Contains(err.Error(), "handler test.untabled has tables of its own (Migrate) but does not name them") {
		t.Errorf("untabled handler: %v", err)
	}
	if _, err := consume.MigrateDatabase(ctx, cfg(nil)); err != nil {
		t.Errorf("migrations only, untabled handler: %v", err)
	}
}

// TestMigrateStepAttachesTheOutboxTables: a database's outbox_tables are
// attached by the deploy's migrate step (a table not created yet is an
// error naming it), and from then on a row a producer inserts into one is
// in relaybus_outbox, the door left empty.
func TestMigrateStepAttachesTheOutboxTables(t *testing.T) {
	ctx := context.Background()
	topo := filepath.Join(t.TempDir(), "topology.yaml")
	doc := strings.Replace(migrateTopology, "  - name: main\n", "  - name: main\n    outbox_tables: [orders_outbox]\n", 1)
	if err := os.WriteFile(topo, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	url := pgtest.Database(t)
	cfg := consume.MigrateConfig{DB: instance.Database{URL: url}, Database: "main"}
	cfg.Topology = topo
	if _, err := consume.MigrateDatabase(ctx, cfg); err == nil || !strings.Contains(err.Error(), "attach orders_outbox: no such table") {
		t.Fatalf("migrate before the producer created its table: %v, want the table named", err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE orders_outbox (LIKE relaybus_outbox INCLUDING DEFAULTS)`); err != nil {
		t.Fatal(err)
	}
	rep, err := consume.MigrateDatabase(ctx, cfg)
	if err != nil || strings.Join(rep.Doors, ",") != "orders_outbox" {
		t.Fatalf("migrate: %+v %v, want orders_outbox attached", rep, err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO orders_outbox (aggregatetype, aggregateid, event_type, version, payload, topic, source)
		VALUES ('order', 'A-1', 'order.purchased', 1, '{}', 'shop.order.events', 'order-service')`); err != nil {
		t.Fatal(err)
	}
	var inOutbox, inDoor int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM relaybus_outbox WHERE aggregateid = 'A-1'), (SELECT count(*) FROM orders_outbox)`).Scan(&inOutbox, &inDoor); err != nil {
		t.Fatal(err)
	}
	if inOutbox != 1 || inDoor != 0 {
		t.Errorf("%d rows in relaybus_outbox, %d in the door; want 1 and 0", inOutbox, inDoor)
	}
}
