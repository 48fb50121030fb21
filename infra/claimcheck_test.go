package infra

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/zclconf/go-cty/cty"

	"github.com/relaybus/relaybus/shared/topology"
)

// The claim check's bucket keeps each object as long as the longest topic
// retention (in whole days), and publish, relay and every consume service
// are told its name and the threshold; turned off, there is no bucket, no
// grant, and the services are told none.
func TestClaimCheckBucketFollowsTheTopicsRetention(t *testing.T) {
	c := loadTerraform(t, terraformDir(t))
	top, err := topology.Load(filepath.Join(terraformDir(t), "..", "topology.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	longest := 0
	for _, tp := range top.Topics {
		longest = max(longest, tp.MessageRetentionSeconds)
	}
	wantDays := (longest + 86399) / 86400

	ev := c.newEvaluator(t, requiredVars(t)).withStubs()
	if got := jsonValue(t, ev.local("claim_check_retention_days")); fmt.Sprint(got) != fmt.Sprint(wantDays) {
		t.Errorf("objects kept %v days, want %v (the longest topic retention)", got, wantDays)
	}
	rule := block(t, "google_storage_bucket.claim_check", c.resource(t, "google_storage_bucket.claim_check").Body, "lifecycle_rule")
	if got := c.exprSource(block(t, "lifecycle_rule", rule, "condition").Attributes["age"].Expr); got != "local.claim_check_retention_days" {
		t.Errorf("lifecycle age %s, want local.claim_check_retention_days", got)
	}
	if got := c.exprSource(block(t, "lifecycle_rule", rule, "action").Attributes["type"].Expr); got != `"Delete"` {
		t.Errorf("lifecycle action %s, want Delete", got)
	}
	bucket := "relaybus-test-relaybus-claims"
	check := func(ev *evaluator, bucket string) {
		t.Helper()
		functions := jsonValue(t, ev.local("functions")).(map[string]any)
		for _, f := range []string{"publish", "relay"} {
			env := functions[f].(map[string]any)["env"].(map[string]any)
			if env["CLAIM_CHECK_BUCKET"] != bucket || env["CLAIM_CHECK_THRESHOLD"] != "1048576" {
				t.Errorf("%s: CLAIM_CHECK_BUCKET %v, CLAIM_CHECK_THRESHOLD %v; want %q, 1048576", f, env["CLAIM_CHECK_BUCKET"], env["CLAIM_CHECK_THRESHOLD"], bucket)
			}
		}
		for _, f := range []string{"rollup", "dlqreplay"} {
			if _, ok := functions[f].(map[string]any)["env"].(map[string]any)["CLAIM_CHECK_BUCKET"]; ok {
				t.Errorf("%s is given CLAIM_CHECK_BUCKET, which it does not read", f)
			}
		}
		for sub, env := range jsonValue(t, ev.local("consume_env")).(map[string]any) {
			if got := env.(map[string]any)["CLAIM_CHECK_BUCKET"]; got != bucket {
				t.Errorf("consume %s: CLAIM_CHECK_BUCKET %v, want %q", sub, got, bucket)
			}
		}
	}
	check(ev, bucket)
	if n := len(jsonValue(t, ev.local("claim_check_writers")).([]any)); n != 2 {
		t.Errorf("%d writers, want publish and relay", n)
	}

	vars := requiredVars(t)
	vars["claim_check"] = cty.ObjectVal(map[string]cty.Value{"enabled": cty.False})
	off := c.newEvaluator(t, vars).withStubs()
	check(off, "")
	if n := len(jsonValue(t, off.local("claim_check_writers")).([]any)); n != 0 {
		t.Errorf("claim check off: %d writers, want none", n)
	}
	if n := len(jsonValue(t, off.local("claim_check_readers")).(map[string]any)); n != 0 {
		t.Errorf("claim check off: %d readers, want none", n)
	}
}
