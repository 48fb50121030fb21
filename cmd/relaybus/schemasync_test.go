package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	vkit "cloud.google.com/go/pubsub/v2/apiv1"
)

// versionDef is a distinct protobuf definition per version.
func versionDef(n int) string {
	return "syntax = \"proto3\"; package shop.v1; message Order { string id = 1;" + strings.Repeat(" string f"+string(rune('a'+n))+" = "+string(rune('1'+n))+";", 1) + " }"
}

// TestSchemasSyncKeepsOneRevisionPerVersion: against Pub/Sub's fake, a
// schema that the old deploy step left with 23 revisions (every version
// committed again on each change, none ever deleted; Pub/Sub refuses the
// 21st) ends with one revision per declared version, the newest last; a
// second run changes nothing; retiring v1 and adding v4 deletes v1's
// revision and commits v4's as the latest.
func TestSchemasSyncKeepsOneRevisionPerVersion(t *testing.T) {
	srv := pstest.NewServer()
	defer srv.Close()
	t.Setenv("PUBSUB_EMULATOR_HOST", srv.Addr)
	ctx := context.Background()
	client, err := vkit.NewSchemaClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const name = "projects/p/schemas/shop.order.events"
	if _, err := client.CreateSchema(ctx, &pubsubpb.CreateSchemaRequest{Parent: "projects/p", SchemaId: "shop.order.events",
		Schema: &pubsubpb.Schema{Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: versionDef(1)}}); err != nil {
		t.Fatal(err)
	}
	// What five deploys of v1..v5 (each re-committing every version and
	// the newest again) would leave, for three of them.
	for round := 1; round <= 7; round++ {
		for v := 1; v <= 3; v++ {
			if _, err := client.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: name, Schema: &pubsubpb.Schema{Name: name, Type: pubsubpb.Schema_PROTOCOL_BUFFER, Definition: versionDef(v)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	dir := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(dir, rel)
		_ = os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	topologyOf := func(versions ...int) {
		var b strings.Builder
		b.WriteString("rollup: {topic: relaybus.ledger.rollup}\ntopics:\n  - name: shop.order.events\n    schemas:\n")
		for _, v := range versions {
			f := "schemas/v" + string(rune('0'+v)) + ".proto"
			write(f, versionDef(v))
			b.WriteString("      - {version: v" + string(rune('0'+v)) + ", type: protobuf, file: " + f + ", message: shop.v1.Order}\n")
		}
		b.WriteString("    consumers: [{service: billing}]\n")
		write("topology.yaml", b.String())
	}
	held := func() []string {
		t.Helper()
		revs, err := revisions(ctx, client, name)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range revs {
			for v := 1; v <= 9; v++ {
				if r.GetDefinition() == versionDef(v) {
					out = append(out, "v"+string(rune('0'+v)))
				}
			}
		}
		return out
	}
	sync := func() string {
		t.Helper()
		code, out, errOut := runCLI("schemas", "sync", "--project", "p", "--topology", filepath.Join(dir, "topology.yaml"))
		if code != 0 {
			t.Fatalf("schemas sync: exit %d\n%s%s", code, out, errOut)
		}
		return out
	}
	if n := len(held()); n != 22 {
		t.Fatalf("the fake holds %d revisions before the sync", n)
	}
	topologyOf(1, 2, 3)
	out := sync()
	if got := strings.Join(held(), ","); got != "v1,v2,v3" {
		t.Fatalf("after the sync: %s (%s)", got, out)
	}
	if out = sync(); !strings.Contains(out, "shop.order.events: 3 revision(s), 0 committed, 0 deleted") {
		t.Errorf("a second sync changed something: %s", out)
	}
	topologyOf(2, 3, 4)
	out = sync()
	if got := strings.Join(held(), ","); got != "v2,v3,v4" || !strings.Contains(out, "1 committed, 1 deleted") {
		t.Errorf("v1 retired, v4 added: %s (%s)", got, out)
	}
	// An older version back: the newest stays the latest revision.
	topologyOf(1, 2, 3, 4)
	sync()
	if got := held(); len(got) != 4 || got[3] != "v4" {
		t.Errorf("v1 back: %v, want four revisions, v4 last", got)
	}
}
