package infra

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
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
// an extra audience check, the re-push rules) keep their defaults in
// production and are left out.
var envNames = map[string]map[string]bool{
	"publish": envTags(reflect.TypeOf(publish.Config{})),
	"relay":   envTags(reflect.TypeOf(relayfn.Config{})),
	"rollup":  envTags(reflect.TypeOf(rollup.Config{})),
	"consume": envTags(reflect.TypeOf(consume.Config{})),
	"dlqreplay": without(envTags(reflect.TypeOf(dlqreplay.Config{})),
		"DLQREPLAY_TOKEN", "DLQREPLAY_AUDIENCE", "DLQREPLAY_MAX_REPUSHES", "DLQREPLAY_SENT_TIMEOUT"),
}

func without(m map[string]bool, names ...string) map[string]bool {
	for _, n := range names {
		if !m[n] {
			panic("dlqreplay.Config has no " + n)
		}
		delete(m, n)
	}
	return m
}

// envTags collects the variable names of a config struct's env tags.
func envTags(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if tag, ok := f.Tag.Lookup("env"); ok {
			name, _, _ := strings.Cut(tag, ",")
			out[strings.TrimSpace(name)] = true
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

// TestCloudRunServices: environment names and values per function, rollup's
// throttle, the relay's timeout above its budget, DATABASE_URL from Secret
// Manager only, the topology path the image bakes in.
func TestCloudRunServices(t *testing.T) {
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot(t), "infra", "docker", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		functions := jsonValue(t, ev.local("functions")).(map[string]any)
		if got := strings.Join(sortedKeys(functions), ","); got != "dlqreplay,publish,relay,rollup" {
			t.Fatalf("single services %s", got)
		}
		for f, v := range functions {
			env := v.(map[string]any)["env"].(map[string]any)
			for name := range env {
				if !envNames[f][name] {
					t.Errorf("%s: sets %s, which it does not read", f, name)
				}
			}
			for name := range envNames[f] {
				_, set := env[name]
				if !set && !(name == "DATABASE_URL" && v.(map[string]any)["database"] == true) {
					t.Errorf("%s: reads %s, which Terraform does not set", f, name)
				}
			}
			if p := env["RELAYBUS_TOPOLOGY"]; !strings.Contains(string(dockerfile), "RELAYBUS_TOPOLOGY="+p.(string)) {
				t.Errorf("%s: RELAYBUS_TOPOLOGY=%v is not where the Dockerfile puts the topology", f, p)
			}
			if env["GOOGLE_CLOUD_PROJECT"] != "relaybus-test" || env["FIRESTORE_DATABASE"] != "(default)" {
				t.Errorf("%s: project %v, database %v", f, env["GOOGLE_CLOUD_PROJECT"], env["FIRESTORE_DATABASE"])
			}
		}
		rollup := functions["rollup"].(map[string]any)
		if rollup["concurrency"] != jsonNum(1) || rollup["max_instances"] != jsonNum(1) {
			t.Errorf("rollup: concurrency %v, max instances %v; want 1 and 1", rollup["concurrency"], rollup["max_instances"])
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
		for f, v := range functions {
			if want := f != "rollup"; v.(map[string]any)["database"] != want {
				t.Errorf("%s: database %v, want %v", f, v.(map[string]any)["database"], want)
			}
		}

		consumeEnv := jsonValue(t, ev.local("consume_env")).(map[string]any)
		for _, cs := range top.Consumers() {
			env, ok := consumeEnv[cs.Subscription()].(map[string]any)
			if !ok {
				t.Errorf("%s: no consume environment", cs.Subscription())
				continue
			}
			for name := range env {
				if !envNames["consume"][name] {
					t.Errorf("consume %s: sets %s, which it does not read", cs.Subscription(), name)
				}
			}
			for name := range envNames["consume"] {
				if _, set := env[name]; !set && name != "DATABASE_URL" {
					t.Errorf("consume %s: reads %s, which Terraform does not set", cs.Subscription(), name)
				}
			}
			want := map[string]any{
				"CONSUMER_ID": cs.Service, "CONSUMER_SUBSCRIPTION": cs.Subscription(), "CONSUMER_HANDLER": cs.Handler,
				"CONSUMER_MAX_DELIVERY_ATTEMPTS": itoa(cs.MaxDeliveryAttempts), "ROLLUP_TOPIC": top.Rollup.Topic,
				"FORWARD_URL": cs.ForwardURL,
			}
			for k, w := range want {
				if env[k] != w {
					t.Errorf("consume %s: %s=%v, want %v", cs.Subscription(), k, env[k], w)
				}
			}
		}
	})

	c := loadTerraform(t, terraformDir(t))
	for _, key := range []string{"google_cloud_run_v2_service.function", "google_cloud_run_v2_service.consume"} {
		src := c.exprSourceOfBlock(c.resource(t, key))
		if !regexp.MustCompile(`(?s)name = "DATABASE_URL"\s*value_source \{\s*secret_key_ref \{`).MatchString(squeeze(src)) {
			t.Errorf("%s: DATABASE_URL does not come from Secret Manager", key)
		}
	}
	for name, a := range c.locals {
		if strings.Contains(c.exprSource(a.Expr), "DATABASE_URL") {
			t.Errorf("local.%s mentions DATABASE_URL: it must only come from Secret Manager", name)
		}
	}
}

// TestSchedulerJobs: the relay job follows the topology's cadence with an
// attempt deadline above the relay's budget; the expiry job calls /expire;
// both authenticate with OIDC.
func TestSchedulerJobs(t *testing.T) {
	forEveryTopology(t, func(t *testing.T, c *tfConfig, ev *evaluator, top *topology.Topology) {
		stubs := resourceStubs(t, ev)
		for _, job := range []string{"relay", "expire", "dead_letter_archive"} {
			b := c.resource(t, "google_cloud_scheduler_job."+job)
			in := newInstance(t, ev, stubs, job, "", cty.NullVal(cty.DynamicPseudoType))
			target := block(t, job, b.Body, "http_target")
			uri := in.attr(target, "uri").AsString()
			oidc := block(t, job, target, "oidc_token")
			if aud := in.attr(oidc, "audience").AsString(); !strings.HasPrefix(uri, aud) || !strings.HasPrefix(aud, "https://relaybus-") {
				t.Errorf("%s: OIDC audience %s for %s", job, aud, uri)
			}
			if got := in.attr(target, "http_method").AsString(); got != "POST" {
				t.Errorf("%s: %s", job, got)
			}
			switch job {
			case "relay":
				if uri != "https://relaybus-relay-test.a.run.app" {
					t.Errorf("relay job calls %s", uri)
				}
				if got := in.attr(b.Body, "schedule").AsString(); got != top.Relay.Schedule {
					t.Errorf("relay schedule %q, topology %q", got, top.Relay.Schedule)
				}
				if got := in.attr(b.Body, "attempt_deadline").AsString(); got != itoa(top.Relay.AttemptDeadlineSeconds)+"s" || top.Relay.AttemptDeadlineSeconds <= top.Relay.TimeBudgetSeconds {
					t.Errorf("relay attempt deadline %s, budget %ds", got, top.Relay.TimeBudgetSeconds)
				}
			case "expire":
				if uri != "https://relaybus-rollup-test.a.run.app/expire" {
					t.Errorf("expire job calls %s", uri)
				}
			}
		}
	})
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
		t.Skip("shared/relay has no Go files yet: nothing to check the log-based metrics against")
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
	for _, f := range regexp.MustCompile(`EXTRACT\(jsonPayload\.(\w+)\)`).FindAllStringSubmatch(string(mon), -1) {
		if !strings.Contains(relaySrc.String(), `"`+f[1]+`"`) {
			t.Errorf("monitoring.tf extracts jsonPayload.%s, a field shared/relay does not log", f[1])
		}
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
