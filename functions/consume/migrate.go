package consume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/pgopen"
	"github.com/relaybus/relaybus/internal/pgroles"
	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/topology"
)

// TableOwner is a Migrator that names the tables its handler reads and
// writes (those its Migrate creates). The deploy's migrate step grants the
// consumer's own Postgres role SELECT, INSERT, UPDATE and DELETE on them
// and on no other handler's tables; a Migrator that does not name its
// tables is refused there, since its consumer's role could not use them.
type TableOwner interface {
	Tables() []string
}

// MigrateConfig is the deploy's migrate step for one database of the
// topology (`consume migrate`, in production the Cloud Run job
// relaybus-migrate-<database> that Terraform runs on every apply): it
// applies every migration the database's users need, the tables of its
// consumers' handlers included, as the database's owner, then gives each
// function and consumer that uses the database its own role
// (internal/pgroles).
type MigrateConfig struct {
	instance.Env
	// DB is the database, with its owner's credentials (DATABASE_URL;
	// DATABASE_DIRECT_URL when DATABASE_URL is a transaction-mode pooler).
	DB instance.Database
	// Database is the topology database it is (MIGRATE_DATABASE, default
	// main).
	Database string `env:"MIGRATE_DATABASE, default=main"`
	// Roles are the roles to create or update, a JSON list of
	// pgroles.Role (DATABASE_ROLES: name, kind, password, consumer,
	// connectionLimit; in production from a Secret Manager secret only the
	// migrate job reads). Empty: migrations only, every function keeps
	// using the owner's credentials (the local stack).
	Roles string `env:"DATABASE_ROLES"`
}

// MigrateReport says what MigrateDatabase did.
type MigrateReport struct {
	// Database is the topology database.
	Database string
	// Handlers are the handlers whose own tables were migrated.
	Handlers []string
	// Roles are the roles created or updated, each "name (kind)".
	Roles []string
	// Doors are the outbox tables attached as doors into relaybus_outbox.
	Doors []string
}

// ForwardersConsumer is the consumer a consume role names in
// DATABASE_ROLES for the forwarders service (CONSUMER_HANDLER=forwarders),
// which serves the forward consumers added at run time from its
// database's registry: no subscription, since those hold dots. Its role is
// granted what a declared consumer's is, the registry among the inbox
// tables, and nothing of a handler of its own.
const ForwardersConsumer = "forwarders"

// builtinHandlers have no tables of their own (the inbox, projection and
// outbox lines hold what they use).
var builtinHandlers = map[string]bool{"projection": true, "strict": true, "forward": true}

// MigrateDatabase runs the deploy's migrate step for cfg.Database (see
// MigrateConfig). It refuses roles that do not fit the database: publish
// uses main only, a consume role names a consumer of this database, each
// function and consumer has at most one role here.
func MigrateDatabase(ctx context.Context, cfg MigrateConfig) (MigrateReport, error) {
	rep := MigrateReport{Database: cfg.Database}
	top, err := topology.Load(cfg.Topology)
	if err != nil {
		return rep, err
	}
	tdb, ok := top.Database(cfg.Database)
	if !ok {
		return rep, fmt.Errorf("MIGRATE_DATABASE=%q: the topology declares no such database", cfg.Database)
	}
	var roles []pgroles.Role
	if strings.TrimSpace(cfg.Roles) != "" {
		dec := json.NewDecoder(strings.NewReader(cfg.Roles))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&roles); err != nil {
			return rep, fmt.Errorf("DATABASE_ROLES: a JSON list of roles (name, kind, password, consumer, connectionLimit): %w", err)
		}
	}
	consumers := map[string]topology.Consumer{}
	for _, c := range top.Consumers() {
		if c.Database == cfg.Database {
			consumers[c.Subscription()] = c
		}
	}
	if err := checkRoles(cfg.Database, roles, consumers); err != nil {
		return rep, fmt.Errorf("DATABASE_ROLES: %w", err)
	}
	db := cfg.DB
	if db.DirectURL != "" {
		db.URL = db.DirectURL
	}
	pool, err := pgopen.Open(ctx, db, Migrations...)
	if err != nil {
		return rep, err
	}
	defer pool.Close()
	// The producers' own outbox tables (the database's outbox_tables):
	// doors into relaybus_outbox (outbox.AttachTables).
	if err := outbox.AttachTables(ctx, pool, tdb.OutboxTables...); err != nil {
		return rep, err
	}
	rep.Doors = tdb.OutboxTables
	log := cfg.Logger()
	// Each consumer's handler: its own tables migrated, and named.
	tables := map[string][]string{}
	subs := make([]string, 0, len(consumers))
	for s := range consumers {
		subs = append(subs, s)
	}
	sort.Strings(subs)
	for _, s := range subs {
		c := consumers[s]
		if builtinHandlers[c.Handler] {
			continue
		}
		h, err := BuildHandler(c.Handler, HandlerConfigFor(c, nil, log))
		if err != nil {
			return rep, fmt.Errorf("consumer %s: %w", s, err)
		}
		m, ok := h.(Migrator)
		if !ok {
			continue
		}
		if err := m.Migrate(ctx, pool); err != nil {
			return rep, fmt.Errorf("consumer %s: handler %s: migrate: %w", s, c.Handler, err)
		}
		rep.Handlers = append(rep.Handlers, c.Handler)
		t, ok := h.(TableOwner)
		if !ok {
			if len(roles) > 0 {
				return rep, fmt.Errorf("consumer %s: handler %s has tables of its own (Migrate) but does not name them (consume.TableOwner): its consumer's role could not use them", s, c.Handler)
			}
			continue
		}
		tables[s] = t.Tables()
	}
	for i := range roles {
		if roles[i].Kind == pgroles.Consume {
			roles[i].Tables = tables[roles[i].Consumer]
		}
		rep.Roles = append(rep.Roles, fmt.Sprintf("%s (%s)", roles[i].Name, roles[i].Kind))
	}
	if len(roles) > 0 {
		if err := pgroles.Apply(ctx, pool, roles); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// checkRoles refuses roles that do not belong on database.
func checkRoles(database string, roles []pgroles.Role, consumers map[string]topology.Consumer) error {
	var errs []error
	kinds := map[string]string{}
	for _, r := range roles {
		who := string(r.Kind)
		switch r.Kind {
		case pgroles.Publish:
			if database != topology.MainDatabase {
				errs = append(errs, fmt.Errorf("role %s: publish writes the %s database's outbox only, not %s's", r.Name, topology.MainDatabase, database))
			}
		case pgroles.Consume:
			if _, ok := consumers[r.Consumer]; !ok && r.Consumer != ForwardersConsumer {
				errs = append(errs, fmt.Errorf("role %s: consumer %q: must be the subscription of a consumer whose database is %s, or %s (the forwarders service)", r.Name, r.Consumer, database, ForwardersConsumer))
			}
			who += " " + r.Consumer
		}
		if r.Kind != pgroles.Consume && r.Consumer != "" {
			errs = append(errs, fmt.Errorf("role %s: consumer: only a consume role names one", r.Name))
		}
		if prev, dup := kinds[who]; dup {
			errs = append(errs, fmt.Errorf("roles %s and %s: one role per function and consumer (%s)", prev, r.Name, who))
		}
		kinds[who] = r.Name
	}
	return errors.Join(errs...)
}
