// Package pgroles gives every relaybus function and every consumer a
// Postgres role of its own, with only the privileges its statements need,
// on the one database it uses: the deploy's migrate step (`consume
// migrate`) runs Apply as the database's owner after the migrations.
//
// # Why
//
// A managed Postgres's users are rarely least-privileged. Cloud SQL makes
// every user it creates a member of cloudsqlsuperuser, with CREATEROLE and
// CREATEDB; before PostgreSQL 16, CREATEROLE lets a role grant itself
// membership in any role that is not a superuser and set any such role's
// password. With one such user per database, the credential of a consumer
// that owns a database of its own could join main's role, write main's
// outbox and reset main's password. The roles Apply creates are plain
// login roles: not superuser, no CREATEROLE, CREATEDB, REPLICATION or
// BYPASSRLS, member of no role, owner of nothing; Apply checks that and
// fails if a role is otherwise.
//
// # What each role may do
//
// In the database Apply runs in (CONNECT is revoked from PUBLIC, so a role
// of another database cannot even connect), in the schema of the
// connection's search_path (USAGE; CREATE is revoked from PUBLIC):
//
//	             outbox tables          inbox tables   projection tables   its handler's tables
//	publish      SELECT INSERT UPDATE   -              -                   -
//	relay        SELECT INSERT UPDATE   -              -                   -
//	             DELETE (retention)
//	dlqreplay    SELECT INSERT UPDATE   all DML        all DML             -
//	consume      SELECT INSERT UPDATE   all DML        all DML             all DML
//
// where "all DML" is SELECT, INSERT, UPDATE and DELETE, the outbox tables
// are relaybus_outbox and every relation named relaybus_outbox_* (the
// dispatch state, re-pushes, the backlog view), the inbox tables
// relaybus_inbox* and relaybus_attempts, the projection tables
// relaybus_projection* and relaybus_strict_*; views get SELECT only. Each
// role may also read relaybus_migrations (a function checks at start that
// its tables are migrated) and use the sequences of the tables it may
// insert into. Nothing else: no TRUNCATE, REFERENCES or TRIGGER, no DDL,
// no temporary tables (the event history's monthly partitions are created
// and dropped by relaybus_outbox_history_partitions, a SECURITY DEFINER
// function of outbox migration 009 that runs as the owner). Apply first revokes whatever a role held on the
// schema's tables and sequences, so privileges that are no longer needed
// do not linger; all of it is one transaction, so a function never sees a
// role half granted.
//
// Passwords are set as SCRAM-SHA-256 verifiers computed here: the
// password itself never reaches the server (nor its statement logs).
package pgroles

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/internal/migrate"
)

// Kind is what a role runs: one of the functions.
type Kind string

// The kinds.
const (
	Publish   Kind = "publish"
	Relay     Kind = "relay"
	Dlqreplay Kind = "dlqreplay"
	Consume   Kind = "consume"
)

// Role is one function's (or one consumer's) login role on a database.
type Role struct {
	// Name is the role's name: lowercase letters, digits and _, at most 63.
	Name string `json:"name"`
	// Kind says which privileges it gets (the table in the package doc).
	Kind Kind `json:"kind"`
	// Password is its password: printable ASCII, at least 16 characters.
	Password string `json:"password"`
	// Consumer names the consumer a Consume role runs (its subscription),
	// for the deploy step that finds its handler's tables; Apply ignores
	// it.
	Consumer string `json:"consumer,omitempty"`
	// Tables are the consume handler's own tables (Consume only), each
	// given SELECT, INSERT, UPDATE and DELETE.
	Tables []string `json:"tables,omitempty"`
	// ConnectionLimit caps the role's concurrent connections (its pools'
	// sizes times its instances), so one credential cannot take the
	// server's every connection; 0 sets no cap.
	ConnectionLimit int `json:"connectionLimit,omitempty"`
}

// group is a set of relaybus's tables that kinds are granted together.
type group string

const (
	groupOutbox     group = "outbox"
	groupInbox      group = "inbox"
	groupProjection group = "projection"
	groupOwn        group = "own" // a consume handler's tables
)

// groupOf returns the group a relation belongs to, or "".
func groupOf(name string) group {
	switch {
	case name == "relaybus_outbox" || strings.HasPrefix(name, "relaybus_outbox_"):
		return groupOutbox
	case name == "relaybus_inbox" || strings.HasPrefix(name, "relaybus_inbox_") || name == "relaybus_attempts":
		return groupInbox
	case name == "relaybus_projection" || strings.HasPrefix(name, "relaybus_projection_") || strings.HasPrefix(name, "relaybus_strict_"):
		return groupProjection
	}
	return ""
}

// Table privileges.
const (
	readWrite  = "SELECT, INSERT, UPDATE"
	allDML     = "SELECT, INSERT, UPDATE, DELETE"
	migrations = "relaybus_migrations"
)

// privileges says what each kind may do on each group's tables.
var privileges = map[Kind]map[group]string{
	Publish:   {groupOutbox: readWrite},
	Relay:     {groupOutbox: allDML},
	Dlqreplay: {groupOutbox: readWrite, groupInbox: allDML, groupProjection: allDML},
	Consume:   {groupOutbox: readWrite, groupInbox: allDML, groupProjection: allDML, groupOwn: allDML},
}

var (
	roleName  = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
	tableName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)
)

// Validate checks a role's fields, naming the field and the rule.
func (r Role) Validate() error {
	var errs []error
	if !roleName.MatchString(r.Name) {
		errs = append(errs, fmt.Errorf("name %q: lowercase letters, digits and _, at most 63, not starting with a digit", r.Name))
	}
	if _, ok := privileges[r.Kind]; !ok {
		errs = append(errs, fmt.Errorf("role %s: kind %q: must be publish, relay, dlqreplay or consume", r.Name, r.Kind))
	}
	if len(r.Password) < 16 || strings.IndexFunc(r.Password, func(c rune) bool { return c < 0x21 || c > 0x7e }) >= 0 {
		errs = append(errs, fmt.Errorf("role %s: password: at least 16 printable ASCII characters", r.Name))
	}
	for _, t := range r.Tables {
		switch {
		case r.Kind != Consume:
			errs = append(errs, fmt.Errorf("role %s: tables: only a consume role has tables of its own", r.Name))
		case !tableName.MatchString(t) || groupOf(t) != "" || t == migrations:
			errs = append(errs, fmt.Errorf("role %s: table %q: a handler's own table, named with lowercase letters, digits and _, not one of relaybus's", r.Name, t))
		}
	}
	if r.ConnectionLimit < 0 {
		errs = append(errs, fmt.Errorf("role %s: connectionLimit %d: 0 (no cap) or more", r.Name, r.ConnectionLimit))
	}
	return errors.Join(errs...)
}

// relation is a table or view of the schema.
type relation struct {
	name string
	view bool
	// sequences are the sequences the relation's columns own (serials).
	sequences []string
}

// Apply creates or updates roles in the database db is connected to and
// grants each exactly its privileges (the package doc), in one
// transaction, as the database's owner (the migrations' role): it revokes
// CONNECT from PUBLIC and grants it to roles, so run it for every database
// with every role that uses it. It fails, changing nothing, if a role
// cannot be made plain (a superuser, or attributes or memberships the
// caller may not take away).
func Apply(ctx context.Context, db migrate.Beginner, roles []Role) error {
	var errs []error
	seen := map[string]bool{}
	for _, r := range roles {
		if err := r.Validate(); err != nil {
			errs = append(errs, err)
		}
		if seen[r.Name] {
			errs = append(errs, fmt.Errorf("role %s: listed twice", r.Name))
		}
		seen[r.Name] = true
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("pgroles: %w", err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgroles: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	var database, schema string
	if err := tx.QueryRow(ctx, `SELECT current_database(), current_schema()`).Scan(&database, &schema); err != nil {
		return fmt.Errorf("pgroles: %w", err)
	}
	rels, err := relations(ctx, tx)
	if err != nil {
		return err
	}
	dbID, schemaID := pgx.Identifier{database}.Sanitize(), pgx.Identifier{schema}.Sanitize()
	stmts := []string{
		"REVOKE ALL ON DATABASE " + dbID + " FROM PUBLIC",
		"REVOKE CREATE ON SCHEMA " + schemaID + " FROM PUBLIC",
	}
	for _, st := range stmts {
		if _, err := tx.Exec(ctx, st); err != nil {
			return fmt.Errorf("pgroles: %s: %w", st, err)
		}
	}
	for _, r := range roles {
		if err := apply(ctx, tx, r, dbID, schemaID, rels); err != nil {
			return fmt.Errorf("pgroles: role %s: %w", r.Name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgroles: commit: %w", err)
	}
	return nil
}

// relations lists the schema's tables and views with their sequences.
func relations(ctx context.Context, tx pgx.Tx) (map[string]*relation, error) {
	rows, err := tx.Query(ctx, `
SELECT c.relname, c.relkind = 'v',
       coalesce(array_agg(s.relname ORDER BY s.relname) FILTER (WHERE s.relname IS NOT NULL), '{}')
FROM pg_class c
LEFT JOIN pg_depend d ON d.refobjid = c.oid AND d.refclassid = 'pg_class'::regclass
                     AND d.classid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
LEFT JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p', 'v')
GROUP BY c.relname, c.relkind`)
	if err != nil {
		return nil, fmt.Errorf("pgroles: list tables: %w", err)
	}
	out := map[string]*relation{}
	for rows.Next() {
		r := &relation{}
		if err := rows.Scan(&r.name, &r.view, &r.sequences); err != nil {
			return nil, fmt.Errorf("pgroles: list tables: %w", err)
		}
		out[r.name] = r
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgroles: list tables: %w", err)
	}
	return out, nil
}

// apply makes one role plain and grants it its privileges.
func apply(ctx context.Context, tx pgx.Tx, r Role, dbID, schemaID string, rels map[string]*relation) error {
	id := pgx.Identifier{r.Name}.Sanitize()
	verifier, err := ScramVerifier(r.Password)
	if err != nil {
		return err
	}
	limit := r.ConnectionLimit
	if limit == 0 {
		limit = -1
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, r.Name).Scan(&exists); err != nil {
		return err
	}
	// A fresh role gets PostgreSQL's defaults: NOSUPERUSER NOCREATEDB
	// NOCREATEROLE NOREPLICATION NOBYPASSRLS. An existing one keeps its
	// attributes unless they must go (checked below): asking for an
	// attribute's default can itself need the attribute (PostgreSQL 16).
	stmt := "CREATE ROLE " + id + " LOGIN NOINHERIT"
	if exists {
		stmt = "ALTER ROLE " + id + " LOGIN NOINHERIT"
	}
	// The verifier is a quoted literal: base64 and $ : only.
	stmt += fmt.Sprintf(" CONNECTION LIMIT %d PASSWORD '%s'", limit, verifier)
	if _, err := tx.Exec(ctx, stmt); err != nil {
		return err
	}
	if err := plain(ctx, tx, r.Name, id); err != nil {
		return err
	}
	grants := []string{
		"GRANT CONNECT ON DATABASE " + dbID + " TO " + id,
		"GRANT USAGE ON SCHEMA " + schemaID + " TO " + id,
		"REVOKE ALL ON ALL TABLES IN SCHEMA " + schemaID + " FROM " + id,
		"REVOKE ALL ON ALL SEQUENCES IN SCHEMA " + schemaID + " FROM " + id,
	}
	if _, ok := rels[migrations]; ok {
		grants = append(grants, "GRANT SELECT ON "+migrations+" TO "+id)
	}
	own := map[string]bool{}
	for _, t := range r.Tables {
		own[t] = true
		if _, ok := rels[t]; !ok {
			return fmt.Errorf("table %s (its handler's) does not exist: its migrations must run first", t)
		}
	}
	names := make([]string, 0, len(rels))
	for n := range rels {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		rel := rels[n]
		g := groupOf(n)
		if own[n] {
			g = groupOwn
		}
		priv := privileges[r.Kind][g]
		if priv == "" {
			continue
		}
		if rel.view {
			priv = "SELECT"
		}
		grants = append(grants, "GRANT "+priv+" ON "+pgx.Identifier{n}.Sanitize()+" TO "+id)
		if strings.Contains(priv, "INSERT") {
			for _, s := range rel.sequences {
				grants = append(grants, "GRANT USAGE, SELECT ON SEQUENCE "+pgx.Identifier{s}.Sanitize()+" TO "+id)
			}
		}
	}
	for _, g := range grants {
		if _, err := tx.Exec(ctx, g); err != nil {
			return fmt.Errorf("%s: %w", g, err)
		}
	}
	return nil
}

// plain takes away what a login role must not have and fails if anything
// is left: superuser, CREATEROLE, CREATEDB, REPLICATION, BYPASSRLS, or
// membership in any role.
func plain(ctx context.Context, tx pgx.Tx, name, id string) error {
	var super, createRole, createDB, replication, bypassRLS bool
	read := func() error {
		return tx.QueryRow(ctx, `SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls FROM pg_roles WHERE rolname = $1`, name).
			Scan(&super, &createRole, &createDB, &replication, &bypassRLS)
	}
	if err := read(); err != nil {
		return err
	}
	if super {
		return errors.New("is a superuser: give the function a role of its own, not this one")
	}
	for _, a := range []struct {
		has  bool
		drop string
	}{{createRole, "NOCREATEROLE"}, {createDB, "NOCREATEDB"}, {replication, "NOREPLICATION"}, {bypassRLS, "NOBYPASSRLS"}} {
		if a.has {
			if _, err := tx.Exec(ctx, "ALTER ROLE "+id+" "+a.drop); err != nil {
				return fmt.Errorf("cannot be made %s: %w", a.drop, err)
			}
		}
	}
	rows, err := tx.Query(ctx, `SELECT r.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid JOIN pg_roles u ON u.oid = m.member WHERE u.rolname = $1`, name)
	if err != nil {
		return err
	}
	memberOf, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, g := range memberOf {
		if _, err := tx.Exec(ctx, "REVOKE "+pgx.Identifier{g}.Sanitize()+" FROM "+id); err != nil {
			return fmt.Errorf("is a member of %s, which cannot be taken away: %w", g, err)
		}
	}
	if err := read(); err != nil {
		return err
	}
	var members int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_auth_members m JOIN pg_roles u ON u.oid = m.member WHERE u.rolname = $1`, name).Scan(&members); err != nil {
		return err
	}
	if createRole || createDB || replication || bypassRLS || members > 0 {
		return fmt.Errorf("is still privileged (CREATEROLE %v, CREATEDB %v, REPLICATION %v, BYPASSRLS %v, member of %d roles)", createRole, createDB, replication, bypassRLS, members)
	}
	return nil
}

// scramIterations is PostgreSQL's default scram_iterations.
const scramIterations = 4096

// ScramVerifier returns password's SCRAM-SHA-256 verifier in the form
// PostgreSQL stores (RFC 5802, RFC 7677):
// SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>, with a fresh
// random salt. ALTER ROLE ... PASSWORD takes it as it is, so the server
// never sees the password. The password must be printable ASCII (which
// SASLprep leaves unchanged).
func ScramVerifier(password string) (string, error) {
	if password == "" || strings.IndexFunc(password, func(c rune) bool { return c < 0x21 || c > 0x7e }) >= 0 {
		return "", errors.New("password: printable ASCII only")
	}
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	return scramVerifier(password, salt, scramIterations)
}

func scramVerifier(password string, salt []byte, iterations int) (string, error) {
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", err
	}
	mac := func(key []byte, msg string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	stored := sha256.Sum256(mac(salted, "Client Key"))
	server := mac(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(stored[:]), b64(server)), nil
}
