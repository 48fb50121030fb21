package infra

import (
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/zclconf/go-cty/cty"

	"github.com/relaybus/relaybus/shared/topology"
)

// firestoreGrant is one project-level grant as it applies to Firestore:
// its member, the datastore permissions its role holds, and the database
// its IAM condition limits it to ("" for every database).
type firestoreGrant struct {
	resource, member, database string
	permissions                map[string]bool
}

// firestoreGrants evaluates every google_project_iam_member: the
// permissions of relaybus's custom roles are read from their resources;
// a predefined role that reaches Firestore (roles/datastore.*, owner,
// editor) counts as every datastore permission.
func firestoreGrants(t *testing.T, c *tfConfig, ev *evaluator) []firestoreGrant {
	t.Helper()
	stubs := resourceStubs(t, ev)
	custom := map[string]map[string]bool{}
	for _, key := range c.resourcesOfType("google_project_iam_custom_role") {
		b := c.resources[key]
		in := newInstance(t, ev, stubs, key, "", cty.NilVal)
		id := in.attr(b.Body, "role_id").AsString()
		perms := map[string]bool{}
		for it := in.attr(b.Body, "permissions").ElementIterator(); it.Next(); {
			_, p := it.Element()
			perms[p.AsString()] = true
		}
		custom[stubProject+"/roles/"+id] = perms
	}
	every := map[string]bool{"datastore.entities.create": true, "datastore.entities.update": true, "datastore.entities.delete": true,
		"datastore.entities.get": true, "datastore.entities.list": true, "datastore.databases.delete": true}
	condDB := regexp.MustCompile(`^resource\.name == "projects/[^/]+/databases/([^"]+)"$`)
	var out []firestoreGrant
	for _, key := range c.resourcesOfType("google_project_iam_member") {
		b := c.resources[key]
		instances := map[string]cty.Value{"": cty.NilVal}
		if _, ok := b.Body.Attributes["for_each"]; ok {
			instances = forEachKeys(t, ev, b)
		} else if _, ok := b.Body.Attributes["count"]; ok {
			instances = map[string]cty.Value{"0": cty.NumberIntVal(0)}
		}
		for k, v := range instances {
			in := newInstance(t, ev, stubs, key, k, v)
			if v != cty.NilVal && v.Type() == cty.Number {
				in.extra["count"] = cty.ObjectVal(map[string]cty.Value{"index": v})
			}
			role := in.attr(b.Body, "role").AsString()
			perms := custom[role]
			if strings.HasPrefix(role, "roles/datastore.") || role == "roles/owner" || role == "roles/editor" {
				perms = every
			}
			g := firestoreGrant{resource: key + "[" + k + "]", member: in.attr(b.Body, "member").AsString(), permissions: map[string]bool{}}
			for p := range perms {
				if strings.HasPrefix(p, "datastore.") {
					g.permissions[p] = true
				}
			}
			for _, cb := range b.Body.Blocks {
				if cb.Type == "condition" {
					expr := in.attr(cb.Body, "expression").AsString()
					m := condDB.FindStringSubmatch(expr)
					if m == nil {
						t.Fatalf("%s: condition %q does not name one database", g.resource, expr)
					}
					g.database = m[1]
				}
			}
			out = append(out, g)
		}
	}
	return out
}

// TestNoServiceCanRewriteTheAuditLog: the Firestore emulator enforces no
// IAM, so the grants are read from the HCL. The operators' audit log is a
// database of its own; dlqreplay's identity may create and read entries
// there and nothing else, no identity may update or delete an entry, a
// consumer's identity holds no Firestore permission at all (its attempts
// reach the ledger through the rollup topic), and no runtime identity may
// delete a document anywhere.
func TestNoServiceCanRewriteTheAuditLog(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		const ledgerDB, auditDB = "(default)", "relaybus-audit"
		dlqreplay := "serviceAccount:relaybus-dlqreplay@relaybus-test.iam.gserviceaccount.com"
		consumers := map[string]bool{}
		for _, cs := range top.Consumers() {
			consumers[consumeMember(ev, cs.Subscription())] = true
		}
		onAudit := map[string][]string{}
		for _, g := range firestoreGrants(t, c, ev) {
			if len(g.permissions) == 0 {
				continue
			}
			var perms []string
			for p := range g.permissions {
				perms = append(perms, p)
			}
			sort.Strings(perms)
			if g.database == "" {
				t.Errorf("%s gives %s %v on every Firestore database", g.resource, g.member, perms)
			}
			if consumers[g.member] {
				t.Errorf("%s gives a consumer's identity %s %v on %s", g.resource, g.member, perms, g.database)
			}
			if g.permissions["datastore.entities.delete"] || g.permissions["datastore.databases.delete"] {
				t.Errorf("%s lets %s delete on %s", g.resource, g.member, g.database)
			}
			if g.database == auditDB || g.database == "" {
				onAudit[g.member] = append(onAudit[g.member], perms...)
				if g.permissions["datastore.entities.update"] {
					t.Errorf("%s lets %s change audit entries", g.resource, g.member)
				}
			}
			if g.database != ledgerDB && g.database != auditDB && g.database != "" {
				t.Errorf("%s: a Firestore grant on %s, neither the ledger's nor the audit log's database", g.resource, g.database)
			}
		}
		if got := strings.Join(onAudit[dlqreplay], " "); got != "datastore.databases.getMetadata datastore.entities.create datastore.entities.get datastore.entities.list" || len(onAudit) != 1 {
			t.Errorf("on the audit database: %v; want dlqreplay alone, creating and reading", onAudit)
		}
	})

	c := loadTerraform(t, terraformDir(t))
	db := squeeze(c.exprSourceOfBlock(c.resource(t, "google_firestore_database.audit")))
	for _, w := range []string{`name = var.audit_firestore_database`, `point_in_time_recovery_enablement = "POINT_IN_TIME_RECOVERY_ENABLED"`,
		`delete_protection_state = var.deletion_protection ? "DELETE_PROTECTION_ENABLED"`} {
		if !strings.Contains(db, w) {
			t.Errorf("the audit database: no %s", w)
		}
	}
	if len(c.resourcesOfType("google_firestore_database_iam_member"))+len(c.resourcesOfType("google_firestore_database_iam_binding")) > 0 {
		t.Error("database-level Firestore grants bypass the conditions this test reads")
	}
	ev := c.newEvaluator(t, requiredVars(t)).withStubs()
	env := jsonValue(t, ev.local("functions")).(map[string]any)["dlqreplay"].(map[string]any)["env"].(map[string]any)
	if env["FIRESTORE_AUDIT_DATABASE"] != "relaybus-audit" || env["FIRESTORE_DATABASE"] != "(default)" {
		t.Errorf("dlqreplay's databases: ledger %v, audit %v", env["FIRESTORE_DATABASE"], env["FIRESTORE_AUDIT_DATABASE"])
	}
}
