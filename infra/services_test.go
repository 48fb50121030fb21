package infra

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/functions/publish"
	relayfn "github.com/relaybus/relaybus/functions/relay"
	"github.com/relaybus/relaybus/functions/rollup"
	"github.com/relaybus/relaybus/shared/topology"
)

// envNames are the environment variables each function reads: the env
// tags of its Config (sethvargo/go-envconfig), walked through embedded
// structs. dlqreplay's optional settings (a token for DLQREPLAY_AUTH=token,
// an extra audience check, the re-push rules, the console's Cloud Trace
// project, which is the function's own) keep their defaults in production
// and are left out.
var envNames = map[string]map[string]bool{
	// PUBLISH_AUDIENCE is left unset: producers call publish at whichever of
	// its URLs they were given, and Cloud Run's IAM checks the audience.
	"publish": without(envTags(reflect.TypeOf(publish.Config{})), "PUBLISH_AUDIENCE"),
	"relay":   envTags(reflect.TypeOf(relayfn.Config{})),
	"rollup":  envTags(reflect.TypeOf(rollup.Config{})),
	// FORWARD_SIGNING_SECRET comes from Secret Manager, for signing
	// forward consumers only (checked below).
	"consume": without(envTags(reflect.TypeOf(consume.Config{})), "FORWARD_SIGNING_SECRET"),
	"dlqreplay": without(envTags(reflect.TypeOf(dlqreplay.Config{})),
		"DLQREPLAY_TOKEN", "DLQREPLAY_MAX_REPUSHES", "DLQREPLAY_SENT_TIMEOUT", "DLQREPLAY_TRACE_PROJECT"),
}

// forwardersEnv are dlqreplay's settings of the forward consumers added at
// run time (docs/forwarding.md): Terraform sets them exactly when it
// deploys the forwarders service (var.forwarders, forwarders_test.go);
// without them POST /forwarders answers 501 and says which is missing.
var forwardersEnv = map[string]bool{"DLQREPLAY_FORWARDERS_URL": true, "DLQREPLAY_FORWARDERS_PUSH_ACCOUNT": true, "DLQREPLAY_FORWARDERS_DATABASE": true}

func without(m map[string]bool, names ...string) map[string]bool {
	for _, n := range names {
		if !m[n] {
			panic("the Config has no " + n)
		}
		delete(m, n)
	}
	return m
}

// localOnly are variables the functions read that production leaves
// unset (their defaults hold there): the emulators' hosts, which the local
// stack and tests set, timings the local stack shortens, and the claim
// check's local directory (production's is CLAIM_CHECK_BUCKET).
var localOnly = map[string]bool{"PUBSUB_EMULATOR_HOST": true, "FIRESTORE_EMULATOR_HOST": true,
	"LEDGER_RECONCILE_AFTER": true, "REGISTRY_CACHE_TTL": true, "CLAIM_CHECK_DIR": true}

// notFromTerraform are variables Terraform leaves alone for another
// reason: K_SERVICE is Cloud Run's own, OTEL_EXPORTER_OTLP_ENDPOINT
// names a collector, which production does not use (it exports to
// telemetry.googleapis.com), and DATABASE_DIRECT_URL is for a database
// behind a transaction-mode pooler (Supabase), where the migrations need
// the database itself: Terraform's Cloud SQL is reached directly.
var notFromTerraform = map[string]bool{"K_SERVICE": true, "K_REVISION": true, "DATABASE_DIRECT_URL": true,
	// The OTLP exporter's destination, protocol and per-signal switches
	// (production exports to telemetry.googleapis.com), OTEL_SDK_DISABLED
	// (TELEMETRY_EXPORT=off is Terraform's switch), the export timeout and
	// the service name (each function names itself) keep their defaults;
	// the retired TELEMETRY_* names are read only to be refused.
	"OTEL_EXPORTER_OTLP_ENDPOINT": true, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": true, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": true,
	"OTEL_EXPORTER_OTLP_PROTOCOL": true, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": true, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": true,
	"OTEL_TRACES_EXPORTER": true, "OTEL_METRICS_EXPORTER": true, "OTEL_SDK_DISABLED": true, "OTEL_METRIC_EXPORT_TIMEOUT": true,
	"OTEL_SERVICE_NAME": true, "TELEMETRY_SAMPLE_RATIO": true, "TELEMETRY_METRIC_INTERVAL": true,
	// Terraform deploys the Pub/Sub transport by default (these variables'
	// defaults); var.nats sets them (nats.tf, TestNATSTransport). CONSUMER_MODE
	// and PULL_MAX_IN_FLIGHT are set (pull.tf, var.pull_mode).
	"TRANSPORT": true, "NATS_URL": true, "NATS_CREDS": true,
	// From Secret Manager when var.privacy_key_secret names the secret
	// (TestPrivacyKeyFromSecretManager), and when forwarders.key_secret
	// does (TestForwardersKeyFromSecretManager).
	"PRIVACY_KEY": true, "RELAYBUS_FORWARDERS_KEY": true}

// envTags collects the variable names of a config struct's env tags
// (localOnly and notFromTerraform left out).
func envTags(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if tag, ok := f.Tag.Lookup("env"); ok {
			name, _, _ := strings.Cut(tag, ",")
			if name = strings.TrimSpace(name); !localOnly[name] && !notFromTerraform[name] {
				out[name] = true
			}
			continue
		}
		if f.Type.Kind() == reflect.Struct {
			for n := range envTags(f.Type) {
				out[n] = true
			}
		}
	}
	return out
}

// TestCloudRunServices: environment names and values per function (both
// ways against each Config's env tags), database URLs from Secret Manager
// only and per the topology's databases, rollup's concurrency, CPU
// allocation for the functions that work after answering, the relay's
// timeout above its budget, the topology path the image bakes in.
func TestCloudRunServices(t *testing.T) {
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot(t), "infra", "docker", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		functions := jsonValue(t, ev.local("functions")).(map[string]any)
		wired := jsonValue(t, ev.local("function_wired_env")).(map[string]any)
		fnDatabases := jsonValue(t, ev.local("function_databases")).(map[string]any)
		if got := strings.Join(sortedKeys(functions), ","); got != "dlqreplay,publish,relay,rollup" {
			t.Fatalf("single services %s", got)
		}
		for f, v := range functions {
			fn := v.(map[string]any)
			env := map[string]any{}
			for name, val := range fn["env"].(map[string]any) {
				env[name] = val
			}
			for name, val := range wired[f].(map[string]any) {
				if _, dup := env[name]; dup {
					t.Errorf("%s: %s set twice", f, name)
				}
				env[name] = val
			}
			for name := range env {
				if strings.HasPrefix(name, "DATABASE_URL") {
					t.Errorf("%s: %s is a plain value; database URLs come from Secret Manager only", f, name)
				}
				if !envNames[f][name] {
					t.Errorf("%s: sets %s, which it does not read", f, name)
				}
			}
			dbs := fnDatabases[f].(map[string]any)
			for name := range envNames[f] {
				_, set := env[name]
				_, fromSecret := dbs[name]
				switch {
				case forwardersEnv[name] && set:
					t.Errorf("%s: sets %s, but the forwarders are off by default", f, name)
				case !set && !fromSecret && !forwardersEnv[name]:
					t.Errorf("%s: reads %s, which Terraform does not set", f, name)
				}
			}
			if p := env["RELAYBUS_TOPOLOGY"]; !strings.Contains(string(dockerfile), "RELAYBUS_TOPOLOGY="+p.(string)) {
				t.Errorf("%s: RELAYBUS_TOPOLOGY=%v is not where the Dockerfile puts the topology", f, p)
			}
			if env["GOOGLE_CLOUD_PROJECT"] != "relaybus-test" || env["FIRESTORE_DATABASE"] != "(default)" {
				t.Errorf("%s: project %v, database %v", f, env["GOOGLE_CLOUD_PROJECT"], env["FIRESTORE_DATABASE"])
			}
			if env["LEDGER_RETENTION"] != "720h" || env["SHUTDOWN_TIMEOUT"] != "8s" {
				t.Errorf("%s: LEDGER_RETENTION %v, SHUTDOWN_TIMEOUT %v; want 720h and 8s", f, env["LEDGER_RETENTION"], env["SHUTDOWN_TIMEOUT"])
			}
			// publish and relay write the ledger after answering: CPU must
			// stay allocated between requests (instance-based billing).
			wantIdle := f == "rollup" || f == "dlqreplay"
			if fn["cpu_idle"] != wantIdle {
				t.Errorf("%s: cpu_idle %v, want %v", f, fn["cpu_idle"], wantIdle)
			}
		}

		// Databases: publish and dlqreplay main; the relay every database
		// under its EnvVar, and RELAY_DATABASES naming them all.
		wantRelay := map[string]any{}
		var names []string
		for _, d := range top.Databases {
			wantRelay[d.EnvVar()] = d.Name
			names = append(names, d.Name)
		}
		if got := fnDatabases["publish"]; !reflect.DeepEqual(got, map[string]any{"DATABASE_URL": topology.MainDatabase}) {
			t.Errorf("publish databases %v, want DATABASE_URL = main", got)
		}
		// dlqreplay, like the relay, gets every database: with main only, a
		// consumer with its own database got a replay dry run of "unknown"
		// and an event page without its outbox state.
		for _, f := range []string{"relay", "dlqreplay"} {
			if got := fnDatabases[f]; !reflect.DeepEqual(got, wantRelay) {
				t.Errorf("%s databases %v, want %v", f, got, wantRelay)
			}
		}
		if got := fnDatabases["rollup"]; len(got.(map[string]any)) != 0 {
			t.Errorf("rollup opens databases %v; it uses none", got)
		}
		if got := functions["relay"].(map[string]any)["env"].(map[string]any)["RELAY_DATABASES"]; got != strings.Join(sorted(names), ",") {
			t.Errorf("RELAY_DATABASES %v, want %s", got, strings.Join(sorted(names), ","))
		}

		rollup := functions["rollup"].(map[string]any)
		if n, _ := rollup["concurrency"].(json.Number).Int64(); n < 2 {
			t.Errorf("rollup: concurrency %v; /reconcile and /expire must not hold the only request slot", rollup["concurrency"])
		}
		relay := functions["relay"].(map[string]any)
		if relay["timeout_seconds"] != jsonNum(top.Relay.AttemptDeadlineSeconds) {
			t.Errorf("relay: request timeout %v, want the Scheduler attempt deadline %d", relay["timeout_seconds"], top.Relay.AttemptDeadlineSeconds)
		}
		for _, f := range []string{"publish", "relay"} {
			if got := functions[f].(map[string]any)["env"].(map[string]any)["RELAY_TIME_BUDGET"]; got != itoa(top.Relay.TimeBudgetSeconds)+"s" {
				t.Errorf("%s: RELAY_TIME_BUDGET %v, want the topology's %ds", f, got, top.Relay.TimeBudgetSeconds)
			}
		}
		dlq := functions["dlqreplay"].(map[string]any)["env"].(map[string]any)
		if dlq["DLQREPLAY_AUTH"] != "cloudrun" {
			t.Errorf("dlqreplay: DLQREPLAY_AUTH %v, want cloudrun (behind Cloud Run IAM)", dlq["DLQREPLAY_AUTH"])
		}
		if got := wired["dlqreplay"].(map[string]any)["DLQREPLAY_ARCHIVERS"]; got != "relaybus-dlq-push@relaybus-test.iam.gserviceaccount.com" {
			t.Errorf("dlqreplay: DLQREPLAY_ARCHIVERS %v, want the DLQ monitors' push identity", got)
		}
		// Every auth mode checks the audience: the service's deterministic
		// URL (the DLQ monitors' push audience, what operators call) and
		// gcloud's client id (a user's default ID token).
		if got := wired["dlqreplay"].(map[string]any)["DLQREPLAY_AUDIENCE"]; got != "https://relaybus-dlqreplay-"+stubProjectNumber+".europe-west1.run.app,32555940559.apps.googleusercontent.com" {
			t.Errorf("dlqreplay: DLQREPLAY_AUDIENCE %v, want its deterministic URL and gcloud's client id", got)
		}
		// Closed by default: the roles and publishers are the required
		// variables', named explicitly.
		if got := dlq["DLQREPLAY_ROLES"]; got != `[{"consumers":[],"member":"group:relaybus-operators@example.com","role":"admin","topics":[]}]` {
			t.Errorf("dlqreplay: DLQREPLAY_ROLES %v, want var.operators", got)
		}
		if got := functions["publish"].(map[string]any)["env"].(map[string]any)["PUBLISH_PUBLISHERS"]; got != `{"shop.order.events":["serviceAccount:shop@relaybus-test.iam.gserviceaccount.com"]}` {
			t.Errorf("publish: PUBLISH_PUBLISHERS %v, want var.publishers", got)
		}

		consumeEnv := jsonValue(t, ev.local("consume_env")).(map[string]any)
		consumeDBs := jsonValue(t, ev.local("consume_databases")).(map[string]any)
		for _, cs := range top.Consumers() {
			env, ok := consumeEnv[cs.Subscription()].(map[string]any)
			if !ok {
				t.Errorf("%s: no consume environment", cs.Subscription())
				continue
			}
			for name := range env {
				if !envNames["consume"][name] || strings.HasPrefix(name, "DATABASE_URL") {
					t.Errorf("consume %s: sets %s as a plain value, which it does not read", cs.Subscription(), name)
				}
			}
			dbs := consumeDBs[cs.Subscription()].(map[string]any)
			if !reflect.DeepEqual(dbs, map[string]any{"DATABASE_URL": cs.Database}) {
				t.Errorf("consume %s: databases %v, want DATABASE_URL = %s (its consumer's database)", cs.Subscription(), dbs, cs.Database)
			}
			for name := range envNames["consume"] {
				_, set := env[name]
				_, fromSecret := dbs[name]
				if !set && !fromSecret {
					t.Errorf("consume %s: reads %s, which Terraform does not set", cs.Subscription(), name)
				}
			}
			want := map[string]any{
				"CONSUMER_ID": cs.Service, "CONSUMER_SUBSCRIPTION": cs.Subscription(), "CONSUMER_HANDLER": cs.Handler,
				"CONSUMER_MAX_DELIVERY_ATTEMPTS": itoa(cs.MaxDeliveryAttempts), "ROLLUP_TOPIC": top.Rollup.Topic,
				"FORWARD_URL":  cs.ForwardURL,
				"FORWARD_AUTH": cs.ForwardAuth, "FORWARD_AUDIENCE": cs.ForwardAudience,
				"FORWARD_TIMEOUT": itoa(cs.ForwardTimeoutSeconds) + "s", "STRICT_GAP_TIMEOUT": itoa(cs.GapTimeoutSeconds) + "s",
				"FORWARD_BREAKER_THRESHOLD":    itoa(cs.ForwardBreakerThreshold),
				"FORWARD_BREAKER_COOLDOWN":     itoa(cs.ForwardBreakerCoolDownSeconds) + "s",
				"FORWARD_BREAKER_MAX_COOLDOWN": itoa(cs.ForwardBreakerMaxCoolDownSeconds) + "s",
				// Pull mode is off by default (pull_test.go turns it on).
				"CONSUMER_MODE": "push", "PULL_MAX_IN_FLIGHT": "5",
			}
			for k, w := range want {
				if env[k] != w {
					t.Errorf("consume %s: %s=%v, want %v", cs.Subscription(), k, env[k], w)
				}
			}
			for _, fs := range []string{"FIRESTORE_DATABASE", "LEDGER_RETENTION"} {
				if _, set := env[fs]; set {
					t.Errorf("consume %s: %s is set, but consume opens no Firestore client", cs.Subscription(), fs)
				}
			}
			if _, set := env["FORWARD_SIGNING_SECRET"]; set {
				t.Errorf("consume %s: FORWARD_SIGNING_SECRET set as a plain value; it belongs in Secret Manager", cs.Subscription())
			}
		}
		// FORWARD_SIGNING_SECRET: from the topology's forward_secret, for
		// the signing forward consumers only.
		signing := jsonValue(t, ev.local("consume_signing_secrets")).(map[string]any)
		for _, cs := range top.Consumers() {
			secret, ok := signing[cs.Subscription()]
			if want := cs.ForwardAuth == topology.ForwardAuthHMAC; ok != want || (want && secret != cs.ForwardSecret) {
				t.Errorf("consume %s (forward_auth %s): signing secret %v, want %q", cs.Subscription(), cs.ForwardAuth, secret, cs.ForwardSecret)
			}
		}
	})

	c := loadTerraform(t, terraformDir(t))
	for _, key := range []string{"google_cloud_run_v2_service.function", "google_cloud_run_v2_service.consume"} {
		src := squeeze(c.exprSourceOfBlock(c.resource(t, key)))
		if !strings.Contains(src, `value_source { secret_key_ref { secret = local.role_secret_ids["${env.value}/${each.key}"] version = "latest" } }`) {
			t.Errorf("%s: the database URLs do not come from the secret of the service's own role on each database", key)
		}
		if !strings.Contains(src, "cpu_idle =") {
			t.Errorf("%s: cpu_idle is not set explicitly (with resources set, the provider's default is CPU always allocated)", key)
		}
	}
	if src := squeeze(c.exprSourceOfBlock(c.resource(t, "google_cloud_run_v2_service.consume"))); !strings.Contains(src,
		`name = "FORWARD_SIGNING_SECRET" value_source { secret_key_ref { secret = env.value version = "latest" } }`) ||
		!strings.Contains(src, `for_each = contains(keys(local.consume_signing_secrets), each.key) ? [local.consume_signing_secrets[each.key]] : []`) {
		t.Errorf("consume: FORWARD_SIGNING_SECRET does not come from the consumer's signing secret")
	}
	if src := squeeze(c.exprSourceOfBlock(c.resource(t, "google_cloud_run_v2_service.consume"))); !strings.Contains(src, "cpu_idle = !var.always_allocated_cpu") {
		t.Errorf("consume: CPU must stay allocated after answering (it writes the ledger in the background)")
	}
	// The URLs (with their passwords) only ever go into their secrets.
	for key, b := range c.resources {
		if key == "google_secret_manager_secret_version.database_url" {
			continue
		}
		if strings.Contains(c.exprSourceOfBlock(b), "local.cloudsql_urls") {
			t.Errorf("%s reads local.cloudsql_urls: database URLs belong in Secret Manager only", key)
		}
	}
}

// TestSchedulerJobs: one relay drain per database on the topology's cadence,
// the consume services' /ledger:ship and /inbox:purge, the strict ones'
// /gaps:check, rollup's /reconcile
// and /expire; every job a POST with an empty body and OIDC to its service,
// its attempt deadline above the service's request timeout; no job calls a
// route that does not exist (the old /deadletters:sync).
func TestSchedulerJobs(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		ev.withStubs()
		stubs := resourceStubs(t, ev)
		functions := jsonValue(t, ev.local("functions")).(map[string]any)
		type call struct{ uri, audience, deadline, schedule string }
		jobs := map[string]call{}
		for _, key := range c.resourcesOfType("google_cloud_scheduler_job") {
			b := c.resources[key]
			instances := map[string]cty.Value{"": cty.NullVal(cty.DynamicPseudoType)}
			if _, ok := b.Body.Attributes["for_each"]; ok {
				instances = forEachKeys(t, ev, b)
			} else if n := countOf(t, ev, b); n == 0 {
				continue // the forwarders' jobs, when they are off
			}
			for k, v := range instances {
				in := newInstance(t, ev, stubs, key, k, v)
				target := block(t, key, b.Body, "http_target")
				if got := in.attr(target, "http_method").AsString(); got != "POST" {
					t.Errorf("%s[%s]: %s, want POST", key, k, got)
				}
				if _, hasBody := target.Attributes["body"]; hasBody {
					t.Errorf("%s: the calls take an empty body", key)
				}
				oidc := block(t, key, target, "oidc_token")
				if got := in.attr(oidc, "service_account_email").AsString(); got != "relaybus-scheduler@relaybus-test.iam.gserviceaccount.com" {
					t.Errorf("%s[%s]: OIDC as %s", key, k, got)
				}
				name := strings.TrimPrefix(key, "google_cloud_scheduler_job.")
				if k != "" {
					name += "[" + k + "]"
				}
				jobs[name] = call{
					uri: in.attr(target, "uri").AsString(), audience: in.attr(oidc, "audience").AsString(),
					deadline: in.attr(b.Body, "attempt_deadline").AsString(), schedule: in.attr(b.Body, "schedule").AsString(),
				}
			}
		}
		check := func(name, uri, audience string, timeoutSeconds int) {
			t.Helper()
			j, ok := jobs[name]
			if !ok {
				t.Errorf("no Scheduler job %s", name)
				return
			}
			delete(jobs, name)
			if j.uri != uri || j.audience != audience {
				t.Errorf("%s: POST %s (audience %s), want %s (audience %s)", name, j.uri, j.audience, uri, audience)
			}
			d, err := strconv.Atoi(strings.TrimSuffix(j.deadline, "s"))
			if err != nil || d <= timeoutSeconds || d < 15 || d > 1800 {
				t.Errorf("%s: attempt deadline %s, want above the service's %ds and within Scheduler's 15s..1800s", name, j.deadline, timeoutSeconds)
			}
		}
		relay := "https://relaybus-relay-test.a.run.app"
		for _, d := range top.Databases {
			name := "relay[" + d.Name + "]"
			if j := jobs[name]; j.schedule != top.Relay.Schedule {
				t.Errorf("%s: schedule %q, topology %q", name, j.schedule, top.Relay.Schedule)
			}
			check(name, relay+"/?database="+d.Name, relay, top.Relay.TimeBudgetSeconds)
		}
		if n, _ := functions["relay"].(map[string]any)["timeout_seconds"].(json.Number).Int64(); int(n) < top.Relay.AttemptDeadlineSeconds {
			t.Errorf("relay request timeout %ds below the attempt deadline", n)
		}
		consumers := jsonValue(t, ev.local("consumers")).(map[string]any)
		for _, cs := range top.Consumers() {
			url := "https://" + consumers[cs.Subscription()].(map[string]any)["run_service"].(string) + "-test.a.run.app"
			check("ledger_ship["+cs.Subscription()+"]", url+"/ledger:ship", url, cs.AckDeadlineSeconds)
			check("inbox_purge["+cs.Subscription()+"]", url+"/inbox:purge", url, cs.AckDeadlineSeconds)
			if cs.Handler == topology.HandlerStrict {
				check("gaps_check["+cs.Subscription()+"]", url+"/gaps:check", url, cs.AckDeadlineSeconds)
			}
			if cs.Handler == topology.HandlerForward && (cs.Delivery == topology.DeliveryPush || cs.Delivery == topology.DeliveryEventarc) && cs.ForwardBreakerThreshold >= 0 {
				check("breaker_probe["+cs.Subscription()+"]", url+"/breaker:probe", url, cs.AckDeadlineSeconds)
			}
		}
		rollup := "https://relaybus-rollup-test.a.run.app"
		rollupTimeout, _ := functions["rollup"].(map[string]any)["timeout_seconds"].(json.Number).Int64()
		check("reconcile", rollup+"/reconcile", rollup, int(rollupTimeout))
		check("expire", rollup+"/expire", rollup, int(rollupTimeout))
		for name, j := range jobs {
			t.Errorf("unexpected Scheduler job %s calling %s", name, j.uri)
		}
	})
	c := loadTerraform(t, terraformDir(t))
	for key, b := range c.resources {
		if strings.Contains(c.exprSourceOfBlock(b), "deadletters:sync") {
			t.Errorf("%s calls /deadletters:sync, a route dlqreplay does not have", key)
		}
	}
}

// TestLogMetricsMatchTheRelaysLogLines: the messages and fields the
// log-based metrics read are logged by shared/relay.
func TestLogMetricsMatchTheRelaysLogLines(t *testing.T) {
	root := repoRoot(t)
	files, _ := filepath.Glob(filepath.Join(root, "shared", "relay", "*.go"))
	var relaySrc strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		relaySrc.Write(b)
	}
	if relaySrc.Len() == 0 {
		t.Fatal("shared/relay has no Go source: nothing to check the log-based metrics against")
	}
	mon, err := os.ReadFile(filepath.Join(terraformDir(t), "monitoring.tf"))
	if err != nil {
		t.Fatal(err)
	}
	msgs := regexp.MustCompile(`\\"(relay: [^"\\]+)\\"`).FindAllStringSubmatch(string(mon), -1)
	if len(msgs) < 3 {
		t.Fatalf("monitoring.tf reads %d relay messages; want drain, retry and final failure", len(msgs))
	}
	for _, m := range msgs {
		if !strings.Contains(relaySrc.String(), `"`+m[1]+`"`) {
			t.Errorf("monitoring.tf counts log lines %q, which shared/relay does not log", m[1])
		}
	}
	// The breaker's metric extracts the forwarder's field
	// (TestBreakerLogMetricMatchesTheBreaker).
	fwd, err := os.ReadFile(filepath.Join(root, "shared", "forward", "forward.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range regexp.MustCompile(`EXTRACT\(jsonPayload\.(\w+)\)`).FindAllStringSubmatch(string(mon), -1) {
		if !strings.Contains(relaySrc.String(), `"`+f[1]+`"`) && !strings.Contains(string(fwd), `"`+f[1]+`"`) {
			t.Errorf("monitoring.tf extracts jsonPayload.%s, a field neither shared/relay nor shared/forward logs", f[1])
		}
	}
}

// TestBreakerLogMetricMatchesTheBreaker: the forward breaker's metric
// counts the lines the breaker and consume's probes log, at the level they
// log them: the breaker opening (shared/forward) and a probe finding the
// target still down while the breaker keeps the consumer paused (consume,
// over push and Eventarc), each with the consumer_id the metric extracts.
func TestBreakerLogMetricMatchesTheBreaker(t *testing.T) {
	root := repoRoot(t)
	read := func(parts ...string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(append([]string{root}, parts...)...))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	mon := read("infra", "terraform", "monitoring.tf")
	const filter = `severity=WARNING AND jsonPayload.message=~\"^(forward: circuit breaker open|consume: the breaker's probe found the target down)\"`
	if !strings.Contains(mon, filter) {
		t.Fatalf("monitoring.tf does not count the breaker's WARNING lines with %s", filter)
	}
	fwd := read("shared", "forward", "forward.go")
	if !regexp.MustCompile(`WarnContext\(ctx, "forward: circuit breaker open[^"]*",\s*append\(attrs`).MatchString(fwd) ||
		!strings.Contains(fwd, `attrs := []any{"consumer_id", f.o.Name`) {
		t.Error(`shared/forward does not log "forward: circuit breaker open" at WARNING with consumer_id`)
	}
	// Both pauses (push endpoint and Eventarc flag) probe through
	// probeUntilUp, which logs the line with the attributes its caller
	// passes; each caller passes the consumer_id.
	if !regexp.MustCompile(`WarnContext\(ctx, "consume: the breaker's probe found the target down[^\n]*,\s*append\(attrs`).MatchString(read("functions", "consume", "breakerpause.go")) {
		t.Error(`functions/consume/breakerpause.go (probeUntilUp) does not log "consume: the breaker's probe found the target down" at WARNING with its caller's attributes`)
	}
	for _, f := range []string{"breakerpause.go", "breakerflag.go"} {
		if !regexp.MustCompile(`probeUntilUp\([^;]*"consumer_id", p\.consumerID`).MatchString(read("functions", "consume", f)) {
			t.Errorf(`functions/consume/%s probes without passing the consumer_id the metric extracts`, f)
		}
	}
}

// TestGapLogMetricMatchesTheResequencer: the strict gap metric counts the
// line shared/projection's resequencer logs, at the level it logs it.
func TestGapLogMetricMatchesTheResequencer(t *testing.T) {
	root := repoRoot(t)
	src, err := os.ReadFile(filepath.Join(root, "shared", "projection", "strict.go"))
	if err != nil {
		t.Fatal(err)
	}
	mon, err := os.ReadFile(filepath.Join(terraformDir(t), "monitoring.tf"))
	if err != nil {
		t.Fatal(err)
	}
	const msg = "consume: version gap past its time"
	if !strings.Contains(string(mon), `severity=ERROR AND jsonPayload.message=\"`+msg+`\"`) {
		t.Errorf("monitoring.tf does not count ERROR lines %q", msg)
	}
	if !strings.Contains(string(src), `ErrorContext(ctx, "`+msg+`"`) {
		t.Errorf("shared/projection does not log %q at ERROR", msg)
	}
}

func jsonNum(n int) any { return json.Number(itoa(n)) }

// squeeze collapses runs of white space, so source can be matched by shape.
func squeeze(s string) string { return strings.Join(strings.Fields(s), " ") }

// exprSourceOfBlock is a block's source text.
func (c *tfConfig) exprSourceOfBlock(b *hclsyntax.Block) string {
	r := b.Range()
	return string(r.SliceBytes(c.src[filepath.Base(r.Filename)]))
}
