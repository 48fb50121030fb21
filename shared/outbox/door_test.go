package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relaybus/relaybus/shared/outbox"
)

// An attached door table moves what a producer inserts into relaybus_outbox
// in the producer's own statement: the INSERT reports its rows, the door
// stays empty, each aggregate gets its dispatch row (the relay publishes
// it), a bad row fails the producer's statement with relaybus_outbox's
// check, and an aggregate's versions are one sequence whichever door they
// came through.
func TestAnAttachedTableIsADoorIntoTheOutbox(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	// Two modules' outboxes: one of the full shape, one with only the
	// columns relaybus_outbox requires (the rest take its defaults).
	if _, err := pool.Exec(ctx, `
CREATE TABLE orders_outbox (LIKE relaybus_outbox INCLUDING DEFAULTS);
CREATE TABLE billing_outbox (id text NOT NULL DEFAULT gen_random_uuid()::text, aggregatetype text NOT NULL, aggregateid text NOT NULL,
	event_type text NOT NULL, version bigint NOT NULL, payload bytea NOT NULL, topic text NOT NULL, source text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if err := outbox.AttachTables(ctx, pool, "orders_outbox", "billing_outbox"); err != nil {
		t.Fatal(err)
	}
	// Attaching again is harmless.
	if err := outbox.AttachTables(ctx, pool, "orders_outbox"); err != nil {
		t.Fatal(err)
	}
	tag, err := pool.Exec(ctx, `INSERT INTO orders_outbox (id, aggregatetype, aggregateid, event_type, version, payload, topic, source, occurred_at)
		VALUES ('o-1', 'order', 'A-1', 'order.purchased', 1, '{"n":1}', 'shop.order.events', 'order-service', now()),
		       ('o-2', 'order', 'A-1', 'order.paid', 2, '{"n":2}', 'shop.order.events', 'order-service', now())`)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != 2 {
		t.Errorf("the producer's INSERT reported %d rows, want 2", tag.RowsAffected())
	}
	if _, err := pool.Exec(ctx, `INSERT INTO billing_outbox (aggregatetype, aggregateid, event_type, version, payload, topic, source)
		VALUES ('invoice', 'I-1', 'invoice.issued', 1, '{}', 'billing.invoice.events', 'billing-service')`); err != nil {
		t.Fatal(err)
	}
	var moved, left, dispatch int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM relaybus_outbox), (SELECT count(*) FROM orders_outbox) + (SELECT count(*) FROM billing_outbox),
		(SELECT count(*) FROM relaybus_outbox_dispatch WHERE due_at IS NOT NULL)`).Scan(&moved, &left, &dispatch); err != nil {
		t.Fatal(err)
	}
	if moved != 3 || left != 0 || dispatch != 2 {
		t.Errorf("%d rows in relaybus_outbox, %d left in the doors, %d aggregates due; want 3, 0, 2", moved, left, dispatch)
	}
	var schemaVersion, payloadType string
	if err := pool.QueryRow(ctx, `SELECT schema_version, payload_type FROM relaybus_outbox WHERE aggregateid = 'I-1'`).Scan(&schemaVersion, &payloadType); err != nil || schemaVersion != "v1" || payloadType == "" {
		t.Errorf("the billing row's defaults: schema %q payload type %q (%v), want relaybus_outbox's", schemaVersion, payloadType, err)
	}

	// A bad row fails the producer's statement, with the column, and
	// leaves nothing anywhere.
	_, err = pool.Exec(ctx, `INSERT INTO orders_outbox (id, aggregatetype, aggregateid, event_type, version, payload, topic, source, occurred_at)
		VALUES ('o-3', 'order', 'A-1', 'order.shipped', 3, '{}', 'Shop.Order', 'order-service', now())`)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23514" || pe.ColumnName != "topic" {
		t.Errorf("a bad row: %v, want check_violation on topic", err)
	}
	// One sequence per aggregate whichever door: version 2 of A-1 again,
	// through the other door, is the outbox's duplicate.
	_, err = pool.Exec(ctx, `INSERT INTO billing_outbox (aggregatetype, aggregateid, event_type, version, payload, topic, source)
		VALUES ('order', 'A-1', 'order.paid', 2, '{}', 'shop.order.events', 'order-service')`)
	if !errors.As(err, &pe) || pe.Code != "23505" {
		t.Errorf("a version already in the outbox through another door: %v, want unique_violation", err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_outbox`).Scan(&moved); err != nil || moved != 3 {
		t.Errorf("%d rows in relaybus_outbox after two refused inserts (%v), want 3", moved, err)
	}
}

// A table that cannot be a door is refused, naming the table, the column
// and the rule.
func TestAttachRefusesATableThatCannotBeADoor(t *testing.T) {
	ctx := context.Background()
	pool := newDB(t)
	if _, err := pool.Exec(ctx, `
CREATE TABLE extra_outbox (LIKE relaybus_outbox INCLUDING DEFAULTS, tenant text);
CREATE TABLE thin_outbox (id text, aggregateid text, version bigint);
CREATE TABLE noid_outbox (aggregatetype text, aggregateid text, event_type text, version bigint, payload bytea, topic text, source text);
CREATE TABLE json_outbox (id text, aggregatetype text, aggregateid text, event_type text, version bigint, payload jsonb, topic text, source text)`); err != nil {
		t.Fatal(err)
	}
	for table, want := range map[string]string{
		"extra_outbox":    "attach extra_outbox: column tenant: relaybus_outbox has no such column",
		"thin_outbox":     "attach thin_outbox: column ",
		"noid_outbox":     "attach noid_outbox: column id: required",
		"missing_outbox":  "attach missing_outbox: no such table",
		"json_outbox":     "attach json_outbox: column payload: of type jsonb, want relaybus_outbox's bytea",
		"relaybus_outbox": `attach "relaybus_outbox": a door table's name is`,
		"Orders":          `attach "Orders": a door table's name is`,
	} {
		if err := outbox.AttachTables(ctx, pool, table); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("attach %s: %v, want an error containing %q", table, err, want)
		}
	}
}
