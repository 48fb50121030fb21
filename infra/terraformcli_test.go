package infra

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

// terraformBinary finds terraform: $TERRAFORM, PATH, $GOPATH/bin (where
// `make tf-fmt` installs it), or a .tools directory in or beside the repository.
func terraformBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TERRAFORM"); p != "" {
		return p
	}
	if p, err := exec.LookPath("terraform"); err == nil {
		return p
	}
	root := repoRoot(t)
	candidates := []string{filepath.Join(root, ".tools", "terraform"), filepath.Join(filepath.Dir(root), ".tools", "terraform")}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, gp := range filepath.SplitList(strings.TrimSpace(string(out))) {
			candidates = append(candidates, filepath.Join(gp, "bin", "terraform"))
		}
	}
	for _, p := range candidates {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no terraform binary under CI: .ci/run installs one with `make terraform` before the tests")
	}
	t.Skip("no terraform binary: `make tf-fmt` installs one (go install github.com/hashicorp/terraform@v1.5.7), or put one on PATH, or set TERRAFORM")
	return ""
}

func terraformCmd(t *testing.T, dir string, args ...string) *exec.Cmd {
	cmd := exec.Command(terraformBinary(t), args...)
	cmd.Dir = dir
	// No CLI configuration, no checkpoint calls: nothing from the network.
	cmd.Env = append(os.Environ(), "TF_CLI_CONFIG_FILE=/dev/null", "CHECKPOINT_DISABLE=1", "TF_IN_AUTOMATION=1")
	return cmd
}

// TestTerraformFmt runs terraform fmt -check on infra/terraform.
func TestTerraformFmt(t *testing.T) {
	cmd := terraformCmd(t, repoRoot(t), "fmt", "-check", "-recursive", "-diff", "infra/terraform")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("terraform fmt -check: %v (run `make tf-fmt` to see, terraform fmt -recursive infra/terraform to fix)\n%s", err, out)
	}
}

// TestTerraformConsoleAgrees evaluates the topology locals with Terraform
// itself (terraform console, no providers needed) and compares them with the
// Go evaluation the other tests use, for every topology case.
func TestTerraformConsoleAgrees(t *testing.T) {
	terraformBinary(t)
	c := loadTerraform(t, terraformDir(t))
	cases := map[string]string{"infra/topology.yaml": ""}
	for k, v := range topologyCases {
		cases[k] = v
	}
	for name, doc := range cases {
		t.Run(name, func(t *testing.T) {
			var path string
			if doc == "" {
				path, _ = repoTopology(t)
			} else {
				path, _ = topologyFile(t, doc)
			}
			dir := t.TempDir()
			for _, f := range []string{"topology.tf", "variables.tf"} {
				b, err := os.ReadFile(filepath.Join(terraformDir(t), f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			const expr = `jsonencode({topics = local.topics, consumers = local.consumers, push = local.push_consumers, eventarc = local.eventarc_consumers, rollup = local.rollup, relay = local.relay, hash = local.topology_hash, databases = local.databases, naming = local.naming_errors})`
			args := []string{"console", "-var", "topology_file=" + path}
			for k, v := range requiredVars(t) {
				if v.Type() == cty.String {
					args = append(args, "-var", k+"="+v.AsString())
					continue
				}
				b, err := ctyjson.Marshal(v, v.Type()) // JSON is an HCL expression
				if err != nil {
					t.Fatal(err)
				}
				args = append(args, "-var", k+"="+string(b))
			}
			cmd := terraformCmd(t, dir, args...)
			cmd.Stdin = strings.NewReader(expr + "\n")
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("terraform console: %v\n%s", err, out)
			}
			var encoded string
			if err := json.Unmarshal([]byte(strings.TrimSpace(string(out))), &encoded); err != nil {
				t.Fatalf("terraform console printed %q: %v", out, err)
			}
			var fromTerraform any
			if err := jsonUnmarshal([]byte(encoded), &fromTerraform); err != nil {
				t.Fatal(err)
			}
			vars := requiredVars(t)
			vars["topology_file"] = cty.StringVal(path)
			ev := c.newEvaluator(t, vars)
			fromGo := map[string]any{
				"topics": jsonValue(t, ev.local("topics")), "consumers": jsonValue(t, ev.local("consumers")),
				"push": jsonValue(t, ev.local("push_consumers")), "eventarc": jsonValue(t, ev.local("eventarc_consumers")),
				"rollup": jsonValue(t, ev.local("rollup")), "relay": jsonValue(t, ev.local("relay")),
				"hash":      jsonValue(t, ev.local("topology_hash")),
				"databases": jsonValue(t, ev.local("databases")),
				"naming":    jsonValue(t, ev.local("naming_errors")),
			}
			if !reflect.DeepEqual(normalize(fromTerraform), normalize(fromGo)) {
				a, _ := json.MarshalIndent(fromTerraform, "", " ")
				b, _ := json.MarshalIndent(fromGo, "", " ")
				t.Errorf("terraform console and the Go evaluation differ:\nterraform: %s\ngo:        %s", a, b)
			}
		})
	}
}

// normalize turns empty maps and empty lists into one shape (jsonencode of
// an empty object and of an empty map print the same).
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 {
			return nil
		}
		out := map[string]any{}
		for k, e := range x {
			out[k] = normalize(e)
		}
		return out
	case []any:
		if len(x) == 0 {
			return nil
		}
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normalize(e)
		}
		return out
	}
	return v
}
