package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// relaybus deploy check --offline: the repository's configuration with a
// sound tfvars is ready; a misspelt pull consumer is named with its fix
// and the command fails, saying nothing was created.
func TestDeployCheckOffline(t *testing.T) {
	top := filepath.Join("..", "..", "infra", "topology.yaml")
	vars := filepath.Join(t.TempDir(), "deploy.tfvars")
	if err := os.WriteFile(vars, []byte(`operators = ["user:me@example.com"]`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI("deploy", "check", "--offline", "--topology", top, "--var-file", vars)
	if code != 0 || !strings.Contains(out, "deploy check: the configuration: ready to apply") {
		t.Fatalf("sound: exit %d\n%s%s", code, out, errOut)
	}
	if err := os.WriteFile(vars, []byte(`pull_mode = { enabled = true, consumers = ["shop.order.events.member-service"] }`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCLI("deploy", "check", "--offline", "--topology", top, "--var-file", vars)
	if code != 1 || !strings.Contains(out, `pull-mode: pull_mode.consumers names "shop.order.events.member-service"`) ||
		!strings.Contains(errOut, "1 problem(s); nothing was created") {
		t.Fatalf("misspelt: exit %d\n%s%s", code, out, errOut)
	}
}
