package publish_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/internal/benchcheck"
)

// orderPurchasedProto is BenchmarkPublish's payload as a protobuf message
// (JSON encoding: the payload is its protojson form).
const orderPurchasedProto = `syntax = "proto3";
package shop.v1;
message OrderPurchased {
  string order_id = 1;
  double amount = 2;
  string currency = 3;
  message Item { string sku = 1; int32 qty = 2; }
  repeated Item items = 4;
  message Customer { string id = 1; string tier = 2; }
  Customer customer = 5;
}
`

// BenchmarkPublishSchemaOverhead runs BenchmarkPublish's load without a
// schema and with a protobuf schema (JSON encoding) on its topic, every
// payload validated before it is written, interleaved three times each
// (interleavedLoads): publish_schema_overhead_pct is the median of the
// rounds' p50 added, (with − without) / without × 100.
func BenchmarkPublishSchemaOverhead(b *testing.B) {
	dir := b.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "schemas"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "schemas", "order.proto"), []byte(orderPurchasedProto), 0o644); err != nil {
		b.Fatal(err)
	}
	doc := strings.Replace(testTopology, "  - name: shop.order.events\n",
		"  - name: shop.order.events\n    schemas: [{version: v1, type: protobuf, file: schemas/order.proto, message: shop.v1.OrderPurchased}]\n", 1)
	path := filepath.Join(dir, "topology.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		b.Fatal(err)
	}
	off, on := interleavedLoads(b, nil, map[string]string{"RELAYBUS_TOPOLOGY": path})
	printCPUOverhead(b, "publish schema overhead", off, on)
	benchcheck.Overhead(b, "publish_schema_overhead_pct",
		"publish_p50_ms without → with a protobuf schema (shop.v1.OrderPurchased, JSON encoding, validated with protojson against a descriptor protocompile compiled at start) on shop.order.events",
		p50s(off), p50s(on), false)
}
