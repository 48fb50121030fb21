package infra

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/relaybus/relaybus/internal/schema"
	"github.com/relaybus/relaybus/shared/topology"
)

// schemaTopology declares a protobuf topic with three versions (v10 sorts
// after v2), an Avro topic, a JSON Schema topic (no Pub/Sub schema) and a
// topic without schemas.
const schemaTopology = `
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    schemas:
      - {version: v2, type: protobuf, file: schemas/order/v2.proto, message: shop.v1.Order}
      - {version: v10, type: protobuf, file: schemas/order/v10.proto, message: shop.v1.Order}
      - {version: v1, type: protobuf, file: schemas/order/v1.proto, message: shop.v1.Order}
    consumers: [{service: billing}]
  - name: shop.cart.events
    schemas:
      - {version: v1, type: avro, file: schemas/cart.avsc}
    consumers: [{service: billing}]
  - name: shop.refund.events
    schemas:
      - {version: v1, type: jsonschema, file: schemas/refund.json}
    consumers: [{service: billing}]
  - name: shop.stock.events
    consumers: [{service: billing}]
`

var schemaFiles = map[string]string{
	"schemas/order/v1.proto":  `syntax = "proto3"; package shop.v1; message Order { string id = 1; }`,
	"schemas/order/v2.proto":  `syntax = "proto3"; package shop.v1; message Order { string id = 1; int64 cents = 2; }`,
	"schemas/order/v10.proto": `syntax = "proto3"; package shop.v1; message Order { string id = 1; int64 cents = 2; string note = 3; }`,
	"schemas/cart.avsc":       `{"type": "record", "name": "Cart", "namespace": "shop", "fields": [{"name": "id", "type": "string"}]}`,
	"schemas/refund.json":     `{"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}`,
}

// TestTopicSchemas evaluates the Pub/Sub schemas Terraform creates from
// the topology (one per protobuf or Avro topic, named after it, its newest
// version the definition, every version's file committed as a revision)
// and the topics' schema_settings, against what internal/schema compiles.
func TestTopicSchemas(t *testing.T) {
	dir := t.TempDir()
	for name, body := range schemaFiles {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "topology.yaml")
	if err := os.WriteFile(path, []byte(schemaTopology), 0o644); err != nil {
		t.Fatal(err)
	}
	top, err := topology.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	set, err := schema.Load(top)
	if err != nil {
		t.Fatalf("the case's schemas do not compile: %v", err)
	}

	c := loadTerraform(t, terraformDir(t))
	vars := requiredVars(t)
	vars["topology_file"] = cty.StringVal(path)
	ev := c.newEvaluator(t, vars)
	stubs := resourceStubs(t, ev)

	type want struct {
		typ, encoding string
		versions      []string
	}
	wants := map[string]want{
		"shop.order.events": {"PROTOCOL_BUFFER", "JSON", []string{"v1", "v2", "v10"}},
		"shop.cart.events":  {"AVRO", "BINARY", []string{"v1"}},
	}
	sch := c.resource(t, "google_pubsub_schema.topic")
	instances := forEachKeys(t, ev, sch)
	if got := sortedKeys(instances); strings.Join(got, ",") != "shop.cart.events,shop.order.events" {
		t.Fatalf("Pub/Sub schemas for %v, want the protobuf and Avro topics only (Pub/Sub has no JSON Schema type)", got)
	}
	for topic, w := range wants {
		in := newInstance(t, ev, stubs, "schema", topic, instances[topic])
		if got := in.attr(sch.Body, "name").AsString(); got != topic {
			t.Errorf("%s: schema named %s", topic, got)
		}
		if got := in.attr(sch.Body, "type").AsString(); got != w.typ {
			t.Errorf("%s: schema type %s, want %s", topic, got, w.typ)
		}
		if got := strings.Join(set.Versions(topic), ","); got != strings.Join(w.versions, ",") {
			t.Errorf("%s: internal/schema has versions %s, want %v", topic, got, w.versions)
		}
		newest, _ := set.For(topic, w.versions[len(w.versions)-1])
		if got := in.attr(sch.Body, "definition").AsString(); got != string(newest.Definition) {
			t.Errorf("%s: definition is not the newest version's file:\n%s", topic, got)
		}
		v := jsonValue(t, instances[topic]).(map[string]any)
		var versions, files []string
		for _, x := range v["versions"].([]any) {
			versions = append(versions, x.(string))
		}
		for _, x := range v["files"].([]any) {
			files = append(files, x.(string))
		}
		if strings.Join(versions, ",") != strings.Join(w.versions, ",") {
			t.Errorf("%s: terraform versions %v, want %v (by number)", topic, versions, w.versions)
		}
		for i, f := range files {
			s, _ := set.For(topic, w.versions[i])
			if b, err := os.ReadFile(f); err != nil || string(b) != string(s.Definition) {
				t.Errorf("%s: file %d (%s) is not %s's schema (%v)", topic, i, f, w.versions[i], err)
			}
		}
	}

	// Every topic with a Pub/Sub schema has its revisions synced (a topic
	// down to one version has its retired revisions deleted).
	rev := c.resource(t, "terraform_data.schema_revisions")
	revs := forEachKeys(t, ev, rev)
	if got := sortedKeys(revs); strings.Join(got, ",") != "shop.cart.events,shop.order.events" {
		t.Errorf("schema revisions synced for %v, want the protobuf and Avro topics", got)
	}

	topicBlock := c.resource(t, "google_pubsub_topic.topic")
	settings := dynamicBlock(t, topicBlock.Body, "schema_settings")
	for _, tp := range top.Topics {
		in := newInstance(t, ev, stubs, "topic", tp.Name, ev.local("topics").GetAttr(tp.Name))
		items := in.attr(settings.Body, "for_each")
		w, hasSchema := wants[tp.Name]
		if n := items.LengthInt(); n != map[bool]int{true: 1, false: 0}[hasSchema] {
			t.Errorf("topic %s: %d schema_settings blocks (schema declared: %v)", tp.Name, n, hasSchema)
			continue
		}
		if !hasSchema {
			continue
		}
		content := block(t, "schema_settings", settings.Body, "content")
		in.extra["schema_settings"] = cty.ObjectVal(map[string]cty.Value{"value": items.Index(cty.NumberIntVal(0))})
		if got := in.attr(content, "encoding").AsString(); got != w.encoding {
			t.Errorf("topic %s: schema_settings encoding %s, want %s", tp.Name, got, w.encoding)
		}
		if got := c.exprSource(content.Attributes["schema"].Expr); got != "google_pubsub_schema.topic[each.key].id" {
			t.Errorf("topic %s: schema_settings.schema is %s, not its topic's Pub/Sub schema", tp.Name, got)
		}
	}
}

// dynamicBlock returns the dynamic block that generates typ.
func dynamicBlock(t *testing.T, body *hclsyntax.Body, typ string) *hclsyntax.Block {
	t.Helper()
	for _, b := range body.Blocks {
		if b.Type == "dynamic" && len(b.Labels) == 1 && b.Labels[0] == typ {
			return b
		}
	}
	t.Fatalf("no dynamic %q block", typ)
	return nil
}
