package infra

import (
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

const stubProject = "projects/relaybus-test"

// resourceStubs stands in for the attributes of created resources that
// resource arguments refer to (ids, names, URLs, emails), shaped as
// Terraform exposes them, so those arguments can be evaluated.
func resourceStubs(t testing.TB, ev *evaluator) map[string]cty.Value {
	t.Helper()
	topics, deadLetters := map[string]cty.Value{}, map[string]cty.Value{}
	for it := ev.local("topics").ElementIterator(); it.Next(); {
		k, v := it.Element()
		name := k.AsString()
		topics[name] = cty.ObjectVal(map[string]cty.Value{"id": cty.StringVal(stubProject + "/topics/" + name), "name": cty.StringVal(name)})
		dlq := v.GetAttr("dead_letter_topic").AsString()
		deadLetters[name] = cty.ObjectVal(map[string]cty.Value{"id": cty.StringVal(stubProject + "/topics/" + dlq), "name": cty.StringVal(dlq)})
	}
	runs, accounts, triggers, pushSubs := map[string]cty.Value{}, map[string]cty.Value{}, map[string]cty.Value{}, map[string]cty.Value{}
	for it := ev.local("consumers").ElementIterator(); it.Next(); {
		k, v := it.Element()
		key := k.AsString()
		run := v.GetAttr("run_service").AsString()
		runs[key] = cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal(run), "uri": cty.StringVal("https://" + run + "-test.a.run.app")})
		email := v.GetAttr("account_id").AsString() + "@relaybus-test.iam.gserviceaccount.com"
		accounts[key] = cty.ObjectVal(map[string]cty.Value{"email": cty.StringVal(email), "member": cty.StringVal("serviceAccount:" + email), "name": cty.StringVal(stubProject + "/serviceAccounts/" + email)})
		triggers[key] = cty.ObjectVal(map[string]cty.Value{"transport": cty.TupleVal([]cty.Value{cty.ObjectVal(map[string]cty.Value{
			"pubsub": cty.TupleVal([]cty.Value{cty.ObjectVal(map[string]cty.Value{
				"subscription": cty.StringVal(stubProject + "/subscriptions/" + stubEventarcSubscription(run)),
			})}),
		})})})
		if v.GetAttr("delivery").AsString() == "push" {
			pushSubs[key] = cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal(key), "id": cty.StringVal(stubProject + "/subscriptions/" + key)})
		}
	}
	pullSubs := map[string]cty.Value{}
	for it := ev.local("pull_consumers").ElementIterator(); it.Next(); {
		k, _ := it.Element()
		key := k.AsString()
		pullSubs[key] = cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal(key), "id": cty.StringVal(stubProject + "/subscriptions/" + key)})
	}
	monitors := map[string]cty.Value{}
	for it := ev.local("topics").ElementIterator(); it.Next(); {
		k, v := it.Element()
		name := v.GetAttr("dead_letter_monitor").AsString()
		monitors[k.AsString()] = cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal(name), "id": cty.StringVal(stubProject + "/subscriptions/" + name)})
	}
	functions := map[string]cty.Value{}
	fnAccounts := map[string]cty.Value{}
	for _, f := range []string{"publish", "relay", "rollup", "dlqreplay"} {
		functions[f] = cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal("relaybus-" + f), "uri": cty.StringVal("https://relaybus-" + f + "-test.a.run.app")})
		fnAccounts[f] = stubAccount("relaybus-" + f)
	}
	obj := func(m map[string]cty.Value) cty.Value {
		if len(m) == 0 {
			return cty.EmptyObjectVal
		}
		return cty.ObjectVal(m)
	}
	// Cloud SQL: the instance (created or existing), one database, user,
	// password and URL secret per Cloud SQL database.
	instance := cty.TupleVal([]cty.Value{cty.ObjectVal(map[string]cty.Value{
		"name":            cty.StringVal("relaybus"),
		"connection_name": cty.StringVal(stubConnectionName),
	})})
	sqlDBs, sqlUsers, passwords, secrets := map[string]cty.Value{}, map[string]cty.Value{}, map[string]cty.Value{}, map[string]cty.Value{}
	for it := ev.local("cloudsql_names").ElementIterator(); it.Next(); {
		k, v := it.Element()
		key := k.AsString()
		sqlDBs[key] = cty.ObjectVal(map[string]cty.Value{"name": v})
		sqlUsers[key] = cty.ObjectVal(map[string]cty.Value{"name": v})
		passwords[key] = cty.ObjectVal(map[string]cty.Value{"result": cty.StringVal(stubPassword(key))})
		secrets[key] = cty.ObjectVal(map[string]cty.Value{
			"secret_id": cty.StringVal("relaybus-database-url-" + key),
			"id":        cty.StringVal(stubProject + "/secrets/relaybus-database-url-" + key),
		})
	}
	// The runtime roles: a password and a URL secret each; a roles secret
	// per Cloud SQL database.
	rolePasswords, roleSecrets, rolesSecrets := map[string]cty.Value{}, map[string]cty.Value{}, map[string]cty.Value{}
	for it := ev.local("database_roles").ElementIterator(); it.Next(); {
		k, v := it.Element()
		key := k.AsString()
		rolePasswords[key] = cty.ObjectVal(map[string]cty.Value{"result": cty.StringVal(stubPassword(strings.ReplaceAll(key, "/", "")))})
		id := "relaybus-database-url-" + v.GetAttr("database").AsString() + "-" + v.GetAttr("slug").AsString()
		roleSecrets[key] = cty.ObjectVal(map[string]cty.Value{"secret_id": cty.StringVal(id), "id": cty.StringVal(stubProject + "/secrets/" + id)})
	}
	for it := ev.local("cloudsql_names").ElementIterator(); it.Next(); {
		k, _ := it.Element()
		id := "relaybus-database-roles-" + k.AsString()
		rolesSecrets[k.AsString()] = cty.ObjectVal(map[string]cty.Value{"secret_id": cty.StringVal(id), "id": cty.StringVal(stubProject + "/secrets/" + id)})
	}
	metrics := map[string]cty.Value{}
	for _, key := range ev.c.resourcesOfType("google_logging_metric") {
		b := ev.c.resources[key]
		name, _ := b.Body.Attributes["name"].Expr.Value(nil)
		metrics[b.Labels[1]] = cty.ObjectVal(map[string]cty.Value{"name": name, "id": name})
	}
	rollupTopic := ev.local("rollup").GetAttr("topic").AsString()
	// The resources of count 0 or 1 (forwarders.tf, claimcheck.tf), at
	// index 0.
	one := func(v cty.Value) cty.Value { return cty.TupleVal([]cty.Value{v}) }
	role := func(id string) cty.Value {
		return cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal(stubProject + "/roles/" + id)})
	}
	return map[string]cty.Value{
		"google_pubsub_topic": cty.ObjectVal(map[string]cty.Value{
			"topic": obj(topics), "dead_letter": obj(deadLetters),
			"rollup": cty.TupleVal([]cty.Value{cty.ObjectVal(map[string]cty.Value{"id": cty.StringVal(stubProject + "/topics/" + rollupTopic), "name": cty.StringVal(rollupTopic)})}),
		}),
		"google_pubsub_subscription": cty.ObjectVal(map[string]cty.Value{"consumer": obj(pushSubs), "consumer_pull": obj(pullSubs), "dead_letter_monitor": obj(monitors)}),
		"google_cloud_run_v2_service": cty.ObjectVal(map[string]cty.Value{"consume": obj(runs), "function": obj(functions),
			"forwarders": one(cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal("relaybus-forwarders"), "uri": cty.StringVal("https://relaybus-forwarders-test.a.run.app")}))}),
		"google_storage_bucket": cty.ObjectVal(map[string]cty.Value{"claim_check": one(cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal(stubClaimCheckBucket)}))}),
		"google_service_account": cty.ObjectVal(map[string]cty.Value{
			"consume": obj(accounts), "function": obj(fnAccounts),
			"scheduler":        stubAccount("relaybus-scheduler"),
			"migrate":          stubAccount("relaybus-migrate"),
			"dead_letter_push": stubAccount("relaybus-dlq-push"),
			"forwarders":       one(stubAccount("relaybus-forwarders")),
			"forwarders_push":  one(stubAccount("relaybus-fwd-push")),
		}),
		"google_eventarc_trigger": cty.ObjectVal(map[string]cty.Value{"consumer": obj(triggers)}),
		"google_project_service_identity": cty.ObjectVal(map[string]cty.Value{
			"pubsub":   stubAgent("service-123456789@gcp-sa-pubsub.iam.gserviceaccount.com"),
			"eventarc": stubAgent("service-123456789@gcp-sa-eventarc.iam.gserviceaccount.com"),
		}),
		"google_sql_database_instance": cty.ObjectVal(map[string]cty.Value{"relaybus": instance}),
		"data": cty.ObjectVal(map[string]cty.Value{"google_sql_database_instance": cty.ObjectVal(map[string]cty.Value{"existing": instance}),
			"google_project": cty.ObjectVal(map[string]cty.Value{"this": cty.ObjectVal(map[string]cty.Value{"number": cty.StringVal(stubProjectNumber)})})}),
		"google_sql_database":          cty.ObjectVal(map[string]cty.Value{"relaybus": obj(sqlDBs)}),
		"google_sql_user":              cty.ObjectVal(map[string]cty.Value{"relaybus": obj(sqlUsers)}),
		"random_password":              cty.ObjectVal(map[string]cty.Value{"database": obj(passwords), "role": obj(rolePasswords)}),
		"google_secret_manager_secret": cty.ObjectVal(map[string]cty.Value{"database_url": obj(secrets), "role_url": obj(roleSecrets), "database_roles": obj(rolesSecrets)}),
		"google_logging_metric":        obj(metrics),
		"google_project_iam_custom_role": cty.ObjectVal(map[string]cty.Value{
			"push_control":            cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal(stubProject + "/roles/relaybusPushControl")}),
			"snapshots":               cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal(stubProject + "/roles/relaybusSnapshots")}),
			"ledger_writer":           cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal(stubProject + "/roles/relaybusLedgerWriter")}),
			"audit_appender":          cty.ObjectVal(map[string]cty.Value{"name": cty.StringVal(stubProject + "/roles/relaybusAuditAppender")}),
			"forwarder_subscriptions": one(role("relaybusForwarderSubscriptions")),
			"attach_subscription":     one(role("relaybusAttachSubscription")),
		}),
	}
}

// The stand-ins' names.
const (
	stubConnectionName   = "relaybus-test:europe-west1:relaybus"
	stubClaimCheckBucket = "relaybus-test-relaybus-claims"
)

func stubEventarcSubscription(runService string) string {
	return "eventarc-europe-west1-" + runService + "-sub-123"
}

func stubPassword(database string) string { return "Pw0" + strings.ReplaceAll(database, "-", "") }

func stubAccount(id string) cty.Value {
	email := id + "@relaybus-test.iam.gserviceaccount.com"
	return cty.ObjectVal(map[string]cty.Value{
		"email": cty.StringVal(email), "member": cty.StringVal("serviceAccount:" + email),
		"name": cty.StringVal(stubProject + "/serviceAccounts/" + email),
	})
}

func stubAgent(email string) cty.Value {
	return cty.ObjectVal(map[string]cty.Value{"email": cty.StringVal(email), "member": cty.StringVal("serviceAccount:" + email)})
}

// forEachKeys evaluates a resource's for_each and returns its instances'
// each values by key.
func forEachKeys(t testing.TB, ev *evaluator, b *hclsyntax.Block) map[string]cty.Value {
	t.Helper()
	a, ok := b.Body.Attributes["for_each"]
	if !ok {
		t.Fatalf("%s.%s has no for_each", b.Labels[0], b.Labels[1])
	}
	v, diags := ev.eval(a.Expr, nil)
	if diags.HasErrors() {
		t.Fatalf("%s.%s for_each: %s", b.Labels[0], b.Labels[1], diags.Error())
	}
	out := map[string]cty.Value{}
	for it := v.ElementIterator(); it.Next(); {
		k, e := it.Element()
		if v.Type().IsSetType() {
			out[e.AsString()] = e
		} else {
			out[k.AsString()] = e
		}
	}
	return out
}

// countOf evaluates a resource's count: 1 when it has none.
func countOf(t testing.TB, ev *evaluator, b *hclsyntax.Block) int {
	t.Helper()
	a, ok := b.Body.Attributes["count"]
	if !ok {
		return 1
	}
	v, diags := ev.eval(a.Expr, nil)
	if diags.HasErrors() {
		t.Fatalf("%s.%s count: %s", b.Labels[0], b.Labels[1], diags.Error())
	}
	n, _ := v.AsBigFloat().Int64()
	return int(n)
}

// instanceEval evaluates expressions of one for_each instance.
type instanceEval struct {
	t     testing.TB
	ev    *evaluator
	extra map[string]cty.Value
	what  string
}

func newInstance(t testing.TB, ev *evaluator, stubs map[string]cty.Value, what, key string, value cty.Value) *instanceEval {
	extra := map[string]cty.Value{}
	for k, v := range stubs {
		extra[k] = v
	}
	extra["each"] = cty.ObjectVal(map[string]cty.Value{"key": cty.StringVal(key), "value": value})
	return &instanceEval{t: t, ev: ev, extra: extra, what: what + "[" + key + "]"}
}

// attr evaluates body's attribute name; missing fails the test.
func (in *instanceEval) attr(body *hclsyntax.Body, name string) cty.Value {
	in.t.Helper()
	a, ok := body.Attributes[name]
	if !ok {
		in.t.Fatalf("%s: no %s", in.what, name)
	}
	v, diags := in.ev.eval(a.Expr, in.extra)
	if diags.HasErrors() {
		in.t.Fatalf("%s.%s: %s", in.what, name, diags.Error())
	}
	return v
}

// block returns the only nested block of a type; missing fails the test.
func block(t testing.TB, what string, body *hclsyntax.Body, typ string) *hclsyntax.Body {
	t.Helper()
	var found []*hclsyntax.Block
	for _, b := range body.Blocks {
		if b.Type == typ {
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: want one %s block, have %d", what, typ, len(found))
	}
	return found[0].Body
}

// refOf names what an expression refers to: "google_x.name",
// "google_x.name[key]" for a literal index, "var.x", "local.x", "each.key",
// or "" for a literal.
func refOf(e hclsyntax.Expression) string {
	switch x := e.(type) {
	case *hclsyntax.ScopeTraversalExpr:
		tr := x.Traversal
		out := tr.RootName()
		for i, step := range tr[1:] {
			switch s := step.(type) {
			case hcl.TraverseAttr:
				if i >= 1 {
					return out
				}
				out += "." + s.Name
			case hcl.TraverseIndex:
				if s.Key.Type() == cty.String {
					return out + "[" + s.Key.AsString() + "]"
				}
				return out
			}
		}
		return out
	case *hclsyntax.RelativeTraversalExpr:
		return refOf(x.Source)
	case *hclsyntax.IndexExpr:
		return refOf(x.Collection)
	case *hclsyntax.TemplateWrapExpr:
		return refOf(x.Wrapped)
	case *hclsyntax.FunctionCallExpr:
		// try(x, fallback) refers to what x does.
		if x.Name == "try" && len(x.Args) > 0 {
			return refOf(x.Args[0])
		}
	}
	return ""
}

// stubProjectNumber is the stand-in project's number (data.google_project).
const stubProjectNumber = "123456789012"
