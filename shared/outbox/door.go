package outbox

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/shared/postgres"
)

// A service whose modules each write an outbox table of their own (orders
// into orders_outbox, billing into billing_outbox, in one database) names
// those tables in the topology (a database's outbox_tables), and the deploy's
// migrate step attaches each with AttachTables. An attached table is a door
// into relaybus_outbox: a statement-level AFTER INSERT trigger moves the
// rows a statement inserted into relaybus_outbox in that same statement
// (where relaybus_outbox's own trigger checks them and writes their
// aggregates' dispatch rows, as for any plain insert) and deletes them from
// the door. The producer's INSERT still reports its row count, a bad row
// fails the producer's statement with relaybus_outbox's error, and the
// relay drains one outbox: an aggregate's versions are one sequence
// whichever door they came through.

// validDoor is a door table's name (topology's outbox_tables rule): a
// lower-case SQL identifier short enough for relaybus_door_<name> to be
// one, not one of relaybus's own tables.
var validDoor = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)

// AttachTables attaches each table (in the connection's search path) as a
// door into relaybus_outbox: see the comment above. The table must exist and
// have an id column and every column relaybus_outbox requires a value for
// (those NOT NULL without a default), each of relaybus_outbox's type;
// columns it has that relaybus_outbox lacks are an error, so nothing a producer writes is dropped. Attaching
// again replaces the trigger (a column added to the door since is then
// carried). Run it as the owner of both tables: the trigger's function
// runs with its owner's rights, so a producer needs INSERT on its door only.
func AttachTables(ctx context.Context, db postgres.DBTX, tables ...string) error {
	outboxCols, err := columns(ctx, db, "relaybus_outbox")
	if err != nil {
		return err
	}
	if len(outboxCols) == 0 {
		return fmt.Errorf("outbox: attach: relaybus_outbox does not exist in the search path: migrate first")
	}
	for _, t := range tables {
		if !validDoor.MatchString(t) || strings.HasPrefix(t, "relaybus_") {
			return fmt.Errorf("outbox: attach %q: a door table's name is a lower-case SQL identifier ([a-z_][a-z0-9_]*, at most 48 characters) not starting with relaybus_", t)
		}
		doorCols, err := columns(ctx, db, t)
		if err != nil {
			return err
		}
		if len(doorCols) == 0 {
			return fmt.Errorf("outbox: attach %s: no such table in the search path", t)
		}
		var carried []string
		for _, c := range doorCols {
			oc, ok := outboxCols[c.name]
			if !ok {
				return fmt.Errorf("outbox: attach %s: column %s: relaybus_outbox has no such column (a door has relaybus_outbox's columns, or a subset)", t, c.name)
			}
			if oc.typ != c.typ {
				return fmt.Errorf("outbox: attach %s: column %s: of type %s, want relaybus_outbox's %s", t, c.name, c.typ, oc.typ)
			}
			carried = append(carried, c.name)
		}
		if !slices.Contains(carried, "id") {
			return fmt.Errorf("outbox: attach %s: column id: required (the trigger deletes the moved rows by id)", t)
		}
		for name, c := range outboxCols {
			if c.required && !slices.Contains(carried, name) {
				return fmt.Errorf("outbox: attach %s: column %s: required (relaybus_outbox has no default for it)", t, name)
			}
		}
		slices.Sort(carried)
		if _, err := db.Exec(ctx, doorSQL(t, carried)); err != nil {
			return fmt.Errorf("outbox: attach %s: %w", t, err)
		}
	}
	return nil
}

// doorSQL is the trigger function and trigger that make table a door.
func doorSQL(table string, cols []string) string {
	ident := func(s string) string { return pgx.Identifier{s}.Sanitize() }
	list := make([]string, len(cols))
	for i, c := range cols {
		list[i] = ident(c)
	}
	fn := ident("relaybus_door_" + table)
	return fmt.Sprintf(`
CREATE OR REPLACE FUNCTION %[1]s() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $door$
BEGIN
	INSERT INTO relaybus_outbox (%[2]s) SELECT %[2]s FROM relaybus_door_rows;
	DELETE FROM %[3]s d USING relaybus_door_rows n WHERE d.id = n.id;
	RETURN NULL;
END
$door$;
CREATE OR REPLACE TRIGGER relaybus_door AFTER INSERT ON %[3]s
	REFERENCING NEW TABLE AS relaybus_door_rows
	FOR EACH STATEMENT EXECUTE FUNCTION %[1]s();`, fn, strings.Join(list, ", "), ident(table))
}

type column struct {
	name, typ string
	required  bool
}

// columns are table's columns in the first schema of the search path
// that has it (none: no such table).
func columns(ctx context.Context, db postgres.DBTX, table string) (map[string]column, error) {
	rows, err := db.Query(ctx, `
SELECT a.attname, format_type(a.atttypid, NULL), a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = ''
FROM pg_attribute a
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`, pgx.Identifier{table}.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("outbox: columns of %s: %w", table, err)
	}
	out := map[string]column{}
	for rows.Next() {
		var c column
		if err := rows.Scan(&c.name, &c.typ, &c.required); err != nil {
			rows.Close()
			return nil, err
		}
		out[c.name] = c
	}
	return out, rows.Err()
}
