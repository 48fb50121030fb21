package history_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/shared/topology"
)

// joined is infra/topology.yaml with newbie declared on topic, as a
// consumer that joins late is before its backfill: the relay sends its
// re-pushes in packs only to a consumer the topology declares.
func joined(t testing.TB) *topology.Topology {
	t.Helper()
	src, err := os.ReadFile("../../infra/topology.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const anchor = "  - name: " + topic + "\n"
	i := strings.Index(string(src), anchor)
	j := strings.Index(string(src)[i:], "    consumers:\n")
	if i < 0 || j < 0 {
		t.Fatalf("infra/topology.yaml declares no consumers of %s", topic)
	}
	at := i + j + len("    consumers:\n")
	decl := "      - service: " + newbie + "\n        description: Joins late and is backfilled (tests).\n        handler: projection\n"
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(path, []byte(string(src[:at])+decl+string(src[at:])), 0o600); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return top
}
