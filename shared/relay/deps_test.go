package relay

import (
	"os/exec"
	"strings"
	"testing"
)

// The engine owns the interface it records through (Ledger) and takes the
// ledger's types from its Firestore-free model package, so a binary that
// links the engine with the ledger off does not link Firestore. go list
// reads the same import graph go build links.
func TestEngineLinksNoFirestore(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 2 {
		t.Fatalf("go list -deps listed %d packages: %q", len(deps), deps)
	}
	for _, d := range deps {
		if strings.Contains(d, "firestore") || d == "github.com/relaybus/relaybus/shared/ledger" {
			t.Errorf("the relay engine depends on %s", d)
		}
	}
}
