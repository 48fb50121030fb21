// Package migrate applies relaybus's embedded SQL migrations.
//
// Each store (the outbox, the inbox, ...) owns a Line: a named, ordered list of
// migrations embedded in its binary as files named NNN_description.sql. Apply
// runs the ones a database has not seen, each in its own transaction, under a
// transaction-level advisory lock so that instances starting together do not
// race, and records them in relaybus_migrations. The statements themselves are
// written to be idempotent (CREATE ... IF NOT EXISTS), so a database migrated
// by hand or by an older binary is also safe.
//
// Tables are created unqualified, in the connection's search_path: point the
// search_path at a schema to keep relaybus's tables there (tests use one
// schema per test).
//
// # Who migrates
//
// Apply first reads relaybus_migrations, and when every migration of the
// line is recorded it changes nothing: so a role that may only read and
// write relaybus's rows (internal/pgroles: a function's or a consumer's
// own role, with no right to create or alter tables) starts as well as the
// owner. A role that finds a migration missing and may not apply it gets
// ErrNotOwner, which says to run the migrations as the owner first (the
// deploy's migrate step, `consume migrate`).
package migrate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relaybus/relaybus/shared/postgres"
)

// ErrNotOwner means a migration is not applied and the connection's role
// may not apply it (Postgres answered insufficient_privilege).
var ErrNotOwner = errors.New("this role may not change the schema: apply the migrations as the database's owner first (the deploy's migrate step, `consume migrate`)")

// Beginner starts transactions: *pgxpool.Pool and *pgx.Conn are Beginners
// (shared/postgres.Beginner, which the public packages' Migrate take).
type Beginner = postgres.Beginner

// Migration is one numbered SQL script.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Line is a named sequence of migrations.
type Line struct {
	Name       string
	Migrations []Migration
}

// lockKey is the advisory lock every Apply takes (an arbitrary constant:
// "relaybus" in ASCII).
const lockKey int64 = 0x72656c6179627573

// LoadFS reads the migrations of line name from dir in fsys. File names must
// be NNN_description.sql with distinct, positive numbers.
func LoadFS(name string, fsys fs.FS, dir string) (Line, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return Line{}, fmt.Errorf("migrations %s: %w", name, err)
	}
	l := Line{Name: name}
	seen := map[int]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		num, desc, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return Line{}, fmt.Errorf("migrations %s: file %q is not named NNN_description.sql", name, e.Name())
		}
		if prev, dup := seen[v]; dup {
			return Line{}, fmt.Errorf("migrations %s: %q and %q share version %d", name, prev, e.Name(), v)
		}
		seen[v] = e.Name()
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return Line{}, err
		}
		l.Migrations = append(l.Migrations, Migration{Version: v, Name: desc, SQL: string(b)})
	}
	sort.Slice(l.Migrations, func(i, j int) bool { return l.Migrations[i].Version < l.Migrations[j].Version })
	return l, nil
}

// MustLoadFS is LoadFS for embedded migrations, which cannot fail at run time
// if they loaded once: it panics on error.
func MustLoadFS(name string, fsys fs.FS, dir string) Line {
	l, err := LoadFS(name, fsys, dir)
	if err != nil {
		panic(err)
	}
	return l
}

// Apply runs the line's migrations that the database has not recorded and
// returns the versions it applied. It is safe to call concurrently and
// repeatedly.
func (l Line) Apply(ctx context.Context, db Beginner) ([]int, error) {
	if l.recorded(ctx, db) {
		return nil, nil
	}
	var applied []int
	for _, m := range l.Migrations {
		done, err := l.apply(ctx, db, m)
		if err != nil {
			return applied, err
		}
		if done {
			applied = append(applied, m.Version)
		}
	}
	return applied, nil
}

// recorded reports whether relaybus_migrations records every migration of
// the line, reading only: an error (no such table yet) is a no.
func (l Line) recorded(ctx context.Context, db Beginner) bool {
	if len(l.Migrations) == 0 {
		return true
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return false
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	var n int
	versions := make([]int32, len(l.Migrations))
	for i, m := range l.Migrations {
		versions[i] = int32(m.Version)
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM relaybus_migrations WHERE line = $1 AND version = ANY($2)`, l.Name, versions).Scan(&n); err != nil {
		return false
	}
	return n == len(l.Migrations)
}

// notOwner wraps an insufficient_privilege answer with ErrNotOwner.
func notOwner(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42501" {
		return fmt.Errorf("%w (%w)", ErrNotOwner, err)
	}
	return err
}

func (l Line) apply(ctx context.Context, db Beginner, m Migration) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migrate %s: begin: %w", l.Name, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey); err != nil {
		return false, fmt.Errorf("migrate %s: lock: %w", l.Name, err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS relaybus_migrations (
		line       text        NOT NULL,
		version    integer     NOT NULL,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (line, version)
	)`); err != nil {
		return false, fmt.Errorf("migrate %s: bookkeeping table: %w", l.Name, notOwner(err))
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM relaybus_migrations WHERE line = $1 AND version = $2)`, l.Name, m.Version).Scan(&exists); err != nil {
		return false, fmt.Errorf("migrate %s: %w", l.Name, err)
	}
	if exists {
		return false, nil
	}
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return false, fmt.Errorf("migrate %s %03d_%s: %w", l.Name, m.Version, m.Name, notOwner(err))
	}
	if _, err := tx.Exec(ctx, `INSERT INTO relaybus_migrations (line, version, name) VALUES ($1, $2, $3)`, l.Name, m.Version, m.Name); err != nil {
		return false, fmt.Errorf("migrate %s: record %d: %w", l.Name, m.Version, notOwner(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("migrate %s %03d_%s: commit: %w", l.Name, m.Version, m.Name, err)
	}
	return true, nil
}
