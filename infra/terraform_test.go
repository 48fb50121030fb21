package infra

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"gopkg.in/yaml.v3"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/topology"
)

func terraformDir(t testing.TB) string { return filepath.Join(repoRoot(t), "infra", "terraform") }

// forEveryTopology runs check for the repository's topology and each edge case.
func forEveryTopology(t *testing.T, check func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology)) {
	c := loadTerraform(t, terraformDir(t))
	cases := map[string]string{"infra/topology.yaml": ""}
	for k, v := range topologyCases {
		cases[k] = v
	}
	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			var path string
			var top *topology.Topology
			if doc == "" {
				path, top = repoTopology(t)
			} else {
				path, top = topologyFile(t, doc)
			}
			vars := requiredVars(t)
			vars["topology_file"] = cty.StringVal(path)
			ev := c.newEvaluator(t, vars)
			check(t, c, ev, top)
		})
	}
}

// TestPushSubscriptionsAreOrderedDeadLetteredRetriedAndFiltered evaluates
// every push consumer's google_pubsub_subscription as Terraform would create
// it and compares it with the topology.
func TestPushSubscriptionsAreOrderedDeadLetteredRetriedAndFiltered(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		b := c.resource(t, "google_pubsub_subscription.consumer")
		stubs := resourceStubs(t, ev)
		instances := forEachKeys(t, ev, b)
		var want []string
		for _, cs := range top.Consumers() {
			if cs.Delivery == topology.DeliveryPush {
				want = append(want, cs.Subscription())
			}
		}
		if got := sortedKeys(instances); strings.Join(got, ",") != strings.Join(sorted(want), ",") {
			t.Fatalf("push subscriptions: terraform %v, topology %v", got, sorted(want))
		}
		for key, value := range instances {
			cs, _ := top.Consumer(key)
			in := newInstance(t, ev, stubs, "google_pubsub_subscription.consumer", key, value)
			body := b.Body
			checks := map[string]cty.Value{
				"name":                       cty.StringVal(cs.Subscription()),
				"topic":                      cty.StringVal(stubProject + "/topics/" + cs.Topic),
				"enable_message_ordering":    cty.True,
				"filter":                     cty.StringVal(cs.Filter()),
				"ack_deadline_seconds":       cty.NumberIntVal(int64(cs.AckDeadlineSeconds)),
				"retain_acked_messages":      cty.True,
				"message_retention_duration": cty.StringVal(itoa(top.Topic(cs.Topic).MessageRetentionSeconds) + "s"),
			}
			for name, w := range checks {
				if got := in.attr(body, name); !got.RawEquals(w) {
					t.Errorf("%s: %s = %#v, want %#v", key, name, got, w)
				}
			}
			dl := block(t, key, body, "dead_letter_policy")
			if got := in.attr(dl, "dead_letter_topic"); got.AsString() != stubProject+"/topics/"+cs.DeadLetterTopic() {
				t.Errorf("%s: dead_letter_topic %s, want %s", key, got.AsString(), cs.DeadLetterTopic())
			}
			if got := in.attr(dl, "max_delivery_attempts"); !got.RawEquals(cty.NumberIntVal(int64(cs.MaxDeliveryAttempts))) {
				t.Errorf("%s: max_delivery_attempts %#v, want %d", key, got, cs.MaxDeliveryAttempts)
			}
			rp := block(t, key, body, "retry_policy")
			if got := in.attr(rp, "minimum_backoff").AsString(); got != itoa(cs.MinBackoffSeconds)+"s" {
				t.Errorf("%s: minimum_backoff %s, want %ds", key, got, cs.MinBackoffSeconds)
			}
			if got := in.attr(rp, "maximum_backoff").AsString(); got != itoa(cs.MaxBackoffSeconds)+"s" {
				t.Errorf("%s: maximum_backoff %s, want %ds", key, got, cs.MaxBackoffSeconds)
			}
			if got := in.attr(block(t, key, body, "expiration_policy"), "ttl").AsString(); got != "" {
				t.Errorf("%s: expiration ttl %q, want never (\"\")", key, got)
			}
			pc := block(t, key, body, "push_config")
			endpoint := in.attr(pc, "push_endpoint").AsString()
			oidc := block(t, key, pc, "oidc_token")
			if aud := in.attr(oidc, "audience").AsString(); aud != endpoint || !strings.Contains(endpoint, "consume-") {
				t.Errorf("%s: push to %s with OIDC audience %s: want its consume service, audience = endpoint", key, endpoint, aud)
			}
			if email := in.attr(oidc, "service_account_email").AsString(); !strings.HasPrefix(email, "rb-consume-") {
				t.Errorf("%s: OIDC identity %s, want the consumer's own service account", key, email)
			}
		}
	})
}

// TestEventarcSubscriptionsGetDeadLetterAndRetryPolicy checks every Eventarc
// consumer's trigger and the gcloud step that applies its dead-letter and
// retry policy (provider issue #17697), re-run on every deploy.
func TestEventarcSubscriptionsGetDeadLetterAndRetryPolicy(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		trigger := c.resource(t, "google_eventarc_trigger.consumer")
		step := c.resource(t, "terraform_data.eventarc_subscription_policy")
		stubs := resourceStubs(t, ev)
		triggers, steps := forEachKeys(t, ev, trigger), forEachKeys(t, ev, step)
		var want []string
		for _, cs := range top.Consumers() {
			if cs.Delivery == topology.DeliveryEventarc {
				want = append(want, cs.Subscription())
			}
		}
		if strings.Join(sortedKeys(triggers), ",") != strings.Join(sorted(want), ",") || strings.Join(sortedKeys(steps), ",") != strings.Join(sorted(want), ",") {
			t.Fatalf("eventarc consumers %v: triggers %v, policy steps %v", sorted(want), sortedKeys(triggers), sortedKeys(steps))
		}
		replace := c.exprSource(step.Body.Attributes["triggers_replace"].Expr)
		if !strings.Contains(replace, "var.image_tag") {
			t.Errorf("the policy step must re-run on every deploy: triggers_replace has no var.image_tag: %s", replace)
		}
		for key, value := range steps {
			cs, _ := top.Consumer(key)
			in := newInstance(t, ev, stubs, "terraform_data.eventarc_subscription_policy", key, value)
			var prov *hclsyntax.Body
			for _, b := range step.Body.Blocks {
				if b.Type == "provisioner" && len(b.Labels) == 1 && b.Labels[0] == "local-exec" {
					prov = b.Body
				}
			}
			if prov == nil {
				t.Fatal("terraform_data.eventarc_subscription_policy has no local-exec provisioner")
			}
			args := shellWords(t, in.attr(prov, "command").AsString())
			if len(args) < 5 || strings.Join(args[1:4], " ") != "pubsub subscriptions update" {
				t.Fatalf("%s: command %v, want gcloud pubsub subscriptions update", key, args)
			}
			if !strings.HasSuffix(args[4], "/subscriptions/eventarc-europe-west1-"+value.GetAttr("run_service").AsString()+"-sub-123") {
				t.Errorf("%s: updates %s, not its trigger's subscription", key, args[4])
			}
			flags := map[string]string{}
			for _, a := range args[5:] {
				k, v, _ := strings.Cut(a, "=")
				flags[k] = v
			}
			wantFlags := map[string]string{
				"--dead-letter-topic":          stubProject + "/topics/" + cs.DeadLetterTopic(),
				"--max-delivery-attempts":      itoa(cs.MaxDeliveryAttempts),
				"--min-retry-delay":            itoa(cs.MinBackoffSeconds) + "s",
				"--max-retry-delay":            itoa(cs.MaxBackoffSeconds) + "s",
				"--ack-deadline":               itoa(cs.AckDeadlineSeconds),
				"--message-retention-duration": itoa(top.Topic(cs.Topic).MessageRetentionSeconds) + "s",
				"--retain-acked-messages":      "",
				"--expiration-period":          "never",
			}
			for k, w := range wantFlags {
				if got, ok := flags[k]; !ok || got != w {
					t.Errorf("%s: %s=%q, want %q (command %v)", key, k, got, w, args)
				}
			}
			tin := newInstance(t, ev, stubs, "google_eventarc_trigger.consumer", key, value)
			tr := block(t, key, trigger.Body, "transport")
			if got := tin.attr(block(t, key, tr, "pubsub"), "topic").AsString(); got != stubProject+"/topics/"+cs.Topic {
				t.Errorf("%s: trigger on %s, want topic %s", key, got, cs.Topic)
			}
		}
	})
}

// TestDeadLetterTopicsAndServiceAgentGrants: every topic has <topic>.dlq and
// <topic>.dlq-monitor, the Pub/Sub service agent may publish to every DLQ,
// and may subscribe to every consumer subscription (both delivery modes).
func TestDeadLetterTopicsAndServiceAgentGrants(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		stubs := resourceStubs(t, ev)
		dlq := c.resource(t, "google_pubsub_topic.dead_letter")
		grant := c.resource(t, "google_pubsub_topic_iam_member.agent_dead_letter")
		monitor := c.resource(t, "google_pubsub_subscription.dead_letter_monitor")
		dlqs, grants, monitors := forEachKeys(t, ev, dlq), forEachKeys(t, ev, grant), forEachKeys(t, ev, monitor)
		for _, tp := range top.Topics {
			v, ok := dlqs[tp.Name]
			if !ok {
				t.Errorf("topic %s has no dead-letter topic", tp.Name)
				continue
			}
			if got := newInstance(t, ev, stubs, "dead_letter", tp.Name, v).attr(dlq.Body, "name").AsString(); got != names.DeadLetter(tp.Name) {
				t.Errorf("topic %s: dead-letter topic %s, want %s", tp.Name, got, names.DeadLetter(tp.Name))
			}
			if mv, ok := monitors[tp.Name]; !ok {
				t.Errorf("topic %s has no dead-letter monitor subscription", tp.Name)
			} else if got := newInstance(t, ev, stubs, "monitor", tp.Name, mv).attr(monitor.Body, "name").AsString(); got != names.DeadLetterMonitor(tp.Name) {
				t.Errorf("topic %s: monitor %s, want %s", tp.Name, got, names.DeadLetterMonitor(tp.Name))
			}
			gv, ok := grants[tp.Name]
			if !ok {
				t.Errorf("dead-letter topic of %s: no service-agent publisher grant", tp.Name)
				continue
			}
			in := newInstance(t, ev, stubs, "agent_dead_letter", tp.Name, gv)
			if got := in.attr(grant.Body, "topic").AsString(); got != names.DeadLetter(tp.Name) {
				t.Errorf("agent grant on %s, want %s", got, names.DeadLetter(tp.Name))
			}
			if got := in.attr(grant.Body, "role").AsString(); got != "roles/pubsub.publisher" {
				t.Errorf("agent grant role %s", got)
			}
		}
		if m := refOf(grant.Body.Attributes["member"].Expr); m != "local.pubsub_service_agent" {
			t.Errorf("dead-letter grant member is %s, not the Pub/Sub service agent", m)
		}
		if agent := c.exprSource(c.locals["pubsub_service_agent"].Expr); agent != "google_project_service_identity.pubsub.member" {
			t.Errorf("local.pubsub_service_agent is %s, not the Pub/Sub service identity's member", agent)
		}
		push := forEachKeys(t, ev, c.resource(t, "google_pubsub_subscription_iam_member.agent_push"))
		eventarc := forEachKeys(t, ev, c.resource(t, "google_pubsub_subscription_iam_member.agent_eventarc"))
		for _, cs := range top.Consumers() {
			m := push
			if cs.Delivery == topology.DeliveryEventarc {
				m = eventarc
			}
			if _, ok := m[cs.Subscription()]; !ok {
				t.Errorf("%s (%s): the service agent cannot acknowledge dead letters on its subscription", cs.Subscription(), cs.Delivery)
			}
		}
	})
}

// TestNothingIsPublic: no IAM resource names allUsers or
// allAuthenticatedUsers, invoker lists refuse them, every invoker is a
// service account of this configuration or such a validated list, and only
// publish and dlqreplay accept traffic from outside Google's network.
func TestNothingIsPublic(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	public := regexp.MustCompile(`allUsers|allAuthenticatedUsers`)
	for key, b := range c.resources {
		if strings.Contains(b.Labels[0], "_iam_binding") || strings.Contains(b.Labels[0], "_iam_policy") {
			t.Errorf("%s: authoritative IAM resources would remove other grants; use *_iam_member", key)
		}
		if !strings.HasSuffix(b.Labels[0], "_iam_member") {
			continue
		}
		src := c.exprSource(b.Body.Attributes["member"].Expr)
		if public.MatchString(src) {
			t.Errorf("%s: public member %s", key, src)
		}
		member := refOf(b.Body.Attributes["member"].Expr)
		switch {
		case strings.HasPrefix(member, "google_service_account."), member == "local.pubsub_service_agent", member == "local.eventarc_service_agent":
		case member == "each.key":
			fe := c.exprSource(b.Body.Attributes["for_each"].Expr)
			if fe != "toset(var.publish_invokers)" && fe != "local.operator_members" && fe != "local.topology_only_publishers" && fe != "local.variable_only_publishers" {
				t.Errorf("%s: member each.key over %s, not a validated invoker list", key, fe)
			}
		default:
			t.Errorf("%s: member %s is neither a relaybus service account, the Pub/Sub agent, nor a validated invoker list", key, member)
		}
	}
	ev := c.newEvaluator(t, requiredVars(t))
	for _, name := range []string{"publish_invokers", "operators", "publishers"} {
		v := c.variables[name]
		val := block(t, "variable "+name, v.Body, "validation")
		cond := val.Attributes["condition"].Expr
		for members, want := range map[string]bool{"allUsers": false, "allAuthenticatedUsers": false, "serviceAccount:a@b.iam.gserviceaccount.com": true} {
			value := cty.ListVal([]cty.Value{cty.StringVal(members)})
			switch name {
			case "operators":
				value = cty.ListVal([]cty.Value{operator(members, "viewer")})
			case "publishers":
				value = cty.MapVal(map[string]cty.Value{"shop.order.events": value})
			}
			ev2 := c.newEvaluator(t, map[string]cty.Value{name: value})
			got, diags := ev2.eval(cond, nil)
			if diags.HasErrors() {
				t.Fatalf("variable %s validation: %s", name, diags.Error())
			}
			if got.True() != want {
				t.Errorf("variable %s = [%q]: validation passes = %v, want %v", name, members, got.True(), want)
			}
		}
	}
	functions := jsonValue(t, ev.local("functions")).(map[string]any)
	for f, v := range functions {
		ingress := v.(map[string]any)["ingress"]
		if (f == "relay" || f == "rollup") && ingress != "INGRESS_TRAFFIC_INTERNAL_ONLY" {
			t.Errorf("%s: ingress %v, want internal only (called by Scheduler and Pub/Sub)", f, ingress)
		}
	}
	if got := c.exprSource(c.resource(t, "google_cloud_run_v2_service.consume").Body.Attributes["ingress"].Expr); got != `"INGRESS_TRAFFIC_INTERNAL_ONLY"` {
		t.Errorf("consume ingress %s, want internal only", got)
	}
}

// TestServiceAccountRolesAreTheDocumentedMinimum compares every grant in
// the configuration with the table in infra/terraform/README.md.
func TestServiceAccountRolesAreTheDocumentedMinimum(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	ev := c.newEvaluator(t, requiredVars(t)).withStubs()
	documented := map[string]bool{}
	readme, err := os.ReadFile(filepath.Join(terraformDir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| `([^`]+)` \\| `([^`]+)` \\| `([^`]+)` \\|")
	for _, line := range strings.Split(string(readme), "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			documented[m[1]+" | "+m[2]+" | "+m[3]] = true
		}
	}
	if len(documented) < 10 {
		t.Fatalf("README.md documents %d grants; the table is missing or malformed", len(documented))
	}
	granted := map[string]string{}
	for key, b := range c.resources {
		if !strings.HasSuffix(b.Labels[0], "_iam_member") {
			continue
		}
		attrs := b.Body.Attributes
		role := refOf(attrs["role"].Expr)
		if role == "" {
			v, diags := attrs["role"].Expr.Value(nil)
			if diags.HasErrors() {
				t.Fatalf("%s: role: %s", key, diags.Error())
			}
			role = v.AsString()
		}
		var target string
		for _, a := range []string{"topic", "subscription", "secret_id", "service_account_id", "bucket", "name", "project"} {
			if x, ok := attrs[a]; ok {
				target = refOf(x.Expr)
				break
			}
		}
		if target == "var.project_id" {
			target = "project"
		}
		member := refOf(attrs["member"].Expr)
		// Resources over a set of functions index the account or the
		// service by each.key: one grant per key.
		keys := []string{""}
		if _, ok := attrs["for_each"]; ok && (member == "google_service_account.function" || target == "google_cloud_run_v2_service.function") {
			keys = sortedKeys(forEachKeys(t, ev, b))
		}
		for _, k := range keys {
			var id string
			switch {
			case member == "local.pubsub_service_agent":
				id = "pubsub-agent"
			case member == "local.eventarc_service_agent":
				id = "eventarc-agent"
			case member == "google_service_account.dead_letter_push":
				id = "dlq-push"
			case member == "each.key":
				id = strings.TrimSuffix(strings.TrimPrefix(c.exprSource(attrs["for_each"].Expr), "toset("), ")")
			case member == "google_service_account.consume":
				id = "consume"
			case member == "google_service_account.scheduler":
				id = "scheduler"
			case member == "google_service_account.migrate":
				id = "migrate"
			case member == "google_service_account.forwarders":
				id = "forwarders"
			case member == "google_service_account.forwarders_push":
				id = "forwarders-push"
			case strings.HasPrefix(member, "google_service_account.function["):
				id = strings.TrimSuffix(strings.TrimPrefix(member, "google_service_account.function["), "]")
			case member == "google_service_account.function" && k != "":
				id = k
			default:
				t.Errorf("%s: member %s not understood", key, member)
				continue
			}
			tgt := target
			if (tgt == "google_cloud_run_v2_service.function" || tgt == "google_service_account.function") && k != "" {
				tgt += "[" + k + "]"
			}
			granted[id+" | "+role+" | "+tgt] = key
		}
	}
	for g, res := range granted {
		if !documented[g] {
			t.Errorf("%s grants %q, which README.md does not document", res, g)
		}
	}
	for d := range documented {
		if _, ok := granted[d]; !ok {
			t.Errorf("README.md documents %q, which iam.tf does not grant", d)
		}
	}
	for _, key := range c.resourcesOfType("google_project_iam_member") {
		b := c.resources[key]
		role := refOf(b.Body.Attributes["role"].Expr)
		if v, _ := b.Body.Attributes["role"].Expr.Value(nil); v.Type() == cty.String {
			role = v.AsString()
		}
		want := map[string]string{"google_project_iam_custom_role.ledger_writer": "local.ledger_database_resource",
			"google_project_iam_custom_role.audit_appender": "local.audit_database_resource"}[role]
		if strings.HasPrefix(role, "roles/datastore.") {
			t.Errorf("%s grants %s: Firestore grants are relaybus's custom roles, each on one database", key, role)
		}
		if want != "" {
			cond := block(t, key, b.Body, "condition")
			if src := c.exprSource(cond.Attributes["expression"].Expr); !strings.Contains(src, want) {
				t.Errorf("%s: the Firestore grant is not limited to its database (%s): %s", key, want, src)
			}
		}
	}
}

// TestLedgerIndexesAreCreated: every composite index and exemption in
// infra/firestore/indexes.yaml becomes a google_firestore_index /
// google_firestore_field, fields in order.
func TestLedgerIndexesAreCreated(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	ev := c.newEvaluator(t, nil)
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "infra", "firestore", "indexes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Composite []struct {
			Collection string `yaml:"collection"`
			Fields     []struct {
				Field string `yaml:"field"`
				Order string `yaml:"order"`
			} `yaml:"fields"`
		} `yaml:"composite"`
		Exemptions []struct {
			Collection string `yaml:"collection"`
			Field      string `yaml:"field"`
		} `yaml:"exemptions"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Composite) == 0 {
		t.Fatal("indexes.yaml declares no composite index")
	}
	indexes := jsonValue(t, ev.local("composite_indexes")).(map[string]any)
	if len(indexes) != len(file.Composite) {
		t.Errorf("terraform creates %d composite indexes, indexes.yaml declares %d (duplicates?)", len(indexes), len(file.Composite))
	}
	for _, ix := range file.Composite {
		var parts []string
		for _, f := range ix.Fields {
			if f.Field != "shard" { // the key is the query's shape (firestore.tf)
				parts = append(parts, f.Field+":"+f.Order)
			}
		}
		key := ix.Collection + ":" + strings.Join(parts, ",")
		got, ok := indexes[key].(map[string]any)
		if !ok {
			t.Errorf("index %s is not created", key)
			continue
		}
		fields := got["fields"].([]any)
		for i, f := range ix.Fields {
			gf := fields[i].(map[string]any)
			if gf["field"] != f.Field || gf["order"] != f.Order {
				t.Errorf("index %s field %d: terraform %v", key, i, gf)
			}
		}
	}
	// An exemption is applied by google_firestore_field.exemption, or by
	// google_firestore_field.ttl when the field is a TTL field (one
	// resource per field: Firestore keeps one configuration per field).
	ex := jsonValue(t, ev.local("index_exemptions")).(map[string]any)
	ttl := jsonValue(t, ev.local("ttl_fields")).(map[string]any)
	for k := range ex {
		if _, dup := ttl[k]; dup {
			t.Errorf("%s is configured by both google_firestore_field.exemption and .ttl", k)
		}
	}
	covered := 0
	for _, e := range file.Exemptions {
		k := e.Collection + "/" + e.Field
		_, inEx := ex[k]
		_, inTTL := ttl[k]
		if !inEx && !inTTL {
			t.Errorf("exemption %s is not applied", k)
		}
		if inEx {
			covered++
		}
	}
	if len(ex) != covered {
		t.Errorf("terraform exempts %d fields that indexes.yaml does not declare", len(ex)-covered)
	}
	ixr := c.resource(t, "google_firestore_index.ledger")
	if fe := c.exprSource(ixr.Body.Attributes["for_each"].Expr); fe != "local.composite_indexes" {
		t.Errorf("google_firestore_index.ledger for_each %s", fe)
	}
	if fe := c.exprSource(c.resource(t, "google_firestore_field.exemption").Body.Attributes["for_each"].Expr); fe != "local.index_exemptions" {
		t.Errorf("google_firestore_field.exemption for_each %s", fe)
	}
	fx := c.resource(t, "google_firestore_field.exemption")
	if ic := block(t, "exemption", fx.Body, "index_config"); len(ic.Attributes)+len(ic.Blocks) != 0 {
		t.Error("exemption index_config must be empty (no single-field indexes)")
	}
}

// requiredVars are values for the variables without a default.
func requiredVars(t testing.TB) map[string]cty.Value {
	return map[string]cty.Value{
		"project_id":       cty.StringVal("relaybus-test"),
		"image_repository": cty.StringVal("europe-west1-docker.pkg.dev/relaybus-test/relaybus"),
		"image_tag":        cty.StringVal("0123456789abcdef0123456789abcdef01234567"),
		// Required: who may use the operations API, and who may publish
		// besides the topology's publishers.
		"operators": cty.ListVal([]cty.Value{operator("group:relaybus-operators@example.com", "admin")}),
		"publishers": cty.MapVal(map[string]cty.Value{
			"shop.order.events": cty.ListVal([]cty.Value{cty.StringVal("serviceAccount:shop@relaybus-test.iam.gserviceaccount.com")}),
		}),
	}
}

// operator is one entry of var.operators.
func operator(member, role string) cty.Value {
	return cty.ObjectVal(map[string]cty.Value{"member": cty.StringVal(member), "role": cty.StringVal(role),
		"topics": cty.ListValEmpty(cty.String), "consumers": cty.ListValEmpty(cty.String)})
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
