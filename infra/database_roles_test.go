package infra

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/pgroles"
	"github.com/relaybus/relaybus/shared/topology"
)

// TestEachServiceConnectsAsItsOwnRole: on Cloud SQL every service reads
// the URL of a role of its own on each database it uses (publish on main;
// the relay and dlqreplay on every database; a consumer on its own), a
// role the migrate job creates with exactly that service's grants
// (internal/pgroles); no service may read the owner's URL (Cloud SQL's user,
// cloudsqlsuperuser with CREATEROLE) nor the roles' passwords, which only
// the migrate job's account reads; a role's secret is readable by its own
// service only; the roles the migrate job gets are valid pgroles.Roles,
// one per service, each capped at twice its pools; the instance is
// PostgreSQL 16 or later by default.
func TestEachServiceConnectsAsItsOwnRole(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		roles := jsonValue(t, ev.local("database_roles")).(map[string]any)
		names := jsonValue(t, ev.local("database_role_names")).(map[string]any)
		urls := jsonValue(t, ev.local("database_role_urls")).(map[string]any)
		secretIDs := jsonValue(t, ev.local("role_secret_ids")).(map[string]any)
		dbNames := jsonValue(t, ev.local("cloudsql_names")).(map[string]any)
		fnDatabases := jsonValue(t, ev.local("function_databases")).(map[string]any)

		// Who uses which database, from the topology.
		want := map[string]string{} // "<database>/<user>" -> kind
		member := map[string]string{}
		for _, d := range top.Databases {
			if d.Name == topology.MainDatabase {
				want[d.Name+"/publish"] = "publish"
			}
			want[d.Name+"/relay"], want[d.Name+"/dlqreplay"] = "relay", "dlqreplay"
		}
		for _, f := range []string{"publish", "relay", "dlqreplay"} {
			member[f] = "serviceAccount:relaybus-" + f + "@relaybus-test.iam.gserviceaccount.com"
		}
		for _, cs := range top.Consumers() {
			want[cs.Database+"/"+cs.Subscription()] = "consume"
			member[cs.Subscription()] = consumeMember(ev, cs.Subscription())
		}
		if got, w := sortedKeys(roles), sortedKeys(want); strings.Join(got, " ") != strings.Join(w, " ") {
			t.Fatalf("roles %v, want one per service and database %v", got, w)
		}
		seenName := map[string]string{}
		for k, v := range roles {
			r := v.(map[string]any)
			db, user, _ := strings.Cut(k, "/")
			name := names[k].(string)
			if r["kind"] != want[k] {
				t.Errorf("%s: kind %v, want %s", k, r["kind"], want[k])
			}
			if prev, dup := seenName[name]; dup {
				t.Errorf("%s and %s share the role name %s", prev, k, name)
			}
			seenName[name] = k
			if !strings.HasPrefix(name, dbNames[db].(string)+"_") || name == dbNames[db] {
				t.Errorf("%s: role %s is not a role of its own on %s", k, name, dbNames[db])
			}
			cfg, err := pgxpool.ParseConfig(urls[k].(string))
			if err != nil {
				t.Fatalf("%s: pgx cannot parse its URL: %v", k, err)
			}
			if cfg.ConnConfig.User != name || cfg.ConnConfig.Database != dbNames[db] || cfg.ConnConfig.Host != "/cloudsql/"+stubConnectionName || cfg.MaxConns != 5 {
				t.Errorf("%s: URL user %q database %q host %q pool %d; want %s on %s through the socket, pool 5",
					k, cfg.ConnConfig.User, cfg.ConnConfig.Database, cfg.ConnConfig.Host, cfg.MaxConns, name, dbNames[db])
			}
			// The service reads this role's secret for this database.
			if user == "publish" || user == "relay" || user == "dlqreplay" {
				env := topology.Database{Name: db}.EnvVar()
				if fnDatabases[user].(map[string]any)[env] != db {
					t.Errorf("%s: %s is not %s's %s", k, user, db, env)
				}
			}
		}

		// Secrets: each role's by its service alone; the owners' URLs and
		// the roles' passwords by the migrate job alone.
		readers := map[string][]string{}
		for _, g := range grantsOf(t, c, ev, "google_secret_manager_secret_iam_member", "secret_id") {
			if g.role == "roles/secretmanager.secretAccessor" {
				readers[g.target] = append(readers[g.target], g.member)
			}
		}
		migrate := "serviceAccount:relaybus-migrate@relaybus-test.iam.gserviceaccount.com"
		for k := range roles {
			_, user, _ := strings.Cut(k, "/")
			if got := readers[secretIDs[k].(string)]; !reflect.DeepEqual(got, []string{member[user]}) {
				t.Errorf("%s: its URL secret %v is readable by %v, want %s only", k, secretIDs[k], got, member[user])
			}
		}
		for db := range dbNames {
			for _, secret := range []string{"relaybus-database-url-" + db, "relaybus-database-roles-" + db} {
				if got := readers[secret]; !reflect.DeepEqual(got, []string{migrate}) {
					t.Errorf("%s is readable by %v, want the migrate job's account only", secret, got)
				}
			}
		}

		// What the migrate job gets: valid roles, one per service, capped.
		specs := jsonValue(t, ev.local("database_role_specs")).(map[string]any)
		for db, list := range specs {
			b, _ := json.Marshal(list)
			var rs []pgroles.Role
			dec := json.NewDecoder(strings.NewReader(string(b)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&rs); err != nil {
				t.Fatalf("%s: the roles secret is not a list of pgroles.Role: %v", db, err)
			}
			for _, r := range rs {
				r.Password = "a-password-long-enough" // the stubs' are short
				if err := r.Validate(); err != nil {
					t.Errorf("%s: %v", db, err)
				}
				k := seenName[r.Name]
				max := roles[k].(map[string]any)["max_instances"].(json.Number)
				if n, _ := max.Int64(); int64(r.ConnectionLimit) != 2*5*n {
					t.Errorf("%s: connection limit %d, want 2 × pool 5 × %d instances", r.Name, r.ConnectionLimit, n)
				}
				if r.Kind == pgroles.Consume && k != db+"/"+r.Consumer {
					t.Errorf("%s: consumer %q, want the role's own (%s)", r.Name, r.Consumer, k)
				}
			}
			if len(rs) != len(dbRoles(roles, db)) {
				t.Errorf("%s: %d roles in its secret, want %d", db, len(rs), len(dbRoles(roles, db)))
			}
		}
	})

	c := loadTerraform(t, terraformDir(t))
	if src := c.exprSource(c.variables["cloud_sql"].Body.Attributes["type"].Expr); !strings.Contains(src, `database_version     = optional(string, "POSTGRES_16")`) {
		t.Errorf("cloud_sql.database_version's default is not POSTGRES_16: %s", src)
	}

	// The migrate job: the consume image's migrate command as the owner,
	// one per database, with every variable it reads; the services start
	// after it ran.
	job := squeeze(c.exprSourceOfBlock(c.resource(t, "google_cloud_run_v2_job.migrate")))
	for _, w := range []string{
		`service_account = google_service_account.migrate.email`, `image = local.images["consume"]`, `args = ["migrate"]`,
		`MIGRATE_DATABASE = each.key`, `DATABASE_URL = google_secret_manager_secret.database_url[each.key].secret_id`,
		`DATABASE_ROLES = google_secret_manager_secret.database_roles[each.key].secret_id`, `mount_path = "/cloudsql"`,
	} {
		if !strings.Contains(job, w) {
			t.Errorf("migrate job: no %s", w)
		}
	}
	for name := range envTags(reflect.TypeOf(consume.MigrateConfig{})) {
		if !strings.Contains(job, name+" =") && !localOnly[name] && !notFromTerraform[name] && !optionalForMigrate[name] {
			t.Errorf("migrate job: %s, which consume migrate reads, is not set", name)
		}
	}
	for _, key := range []string{"google_cloud_run_v2_service.function", "google_cloud_run_v2_service.consume"} {
		if !contains(dependsOn(t, c.resource(t, key)), "terraform_data.migrate") {
			t.Errorf("%s does not wait for the migrate job", key)
		}
	}
	if src := squeeze(c.exprSourceOfBlock(c.resource(t, "terraform_data.migrate"))); !strings.Contains(src, "run jobs execute ${google_cloud_run_v2_job.migrate[each.key].name}") || !strings.Contains(src, "--wait") {
		t.Errorf("terraform_data.migrate does not execute the job and wait: %s", src)
	}
}

// optionalForMigrate are consume migrate's variables that keep their
// defaults in production: telemetry (the step exports nothing) and the
// shutdown bound of a command that is not a server.
var optionalForMigrate = func() map[string]bool {
	m := map[string]bool{"SHUTDOWN_TIMEOUT": true, "DATABASE_DIRECT_URL": true}
	for name := range envTags(reflect.TypeOf(otelsetup.Config{})) {
		m[name] = true
	}
	return m
}()

func dbRoles(roles map[string]any, db string) []string {
	var out []string
	for k := range roles {
		if strings.HasPrefix(k, db+"/") {
			out = append(out, k)
		}
	}
	return out
}
