package publish_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
// payload validated before it is written, interleaved (interleavedLoads):
// publish_schema_overhead_pct is the p50 added, (with − without) /
// without × 100.
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
	offP50, offP99, onP50, onP99 := off.p50, off.p99, on.p50, on.p99
	fmt.Printf("# publish schema overhead: the publish load above four times, without a schema, with a protobuf schema (shop.v1.OrderPurchased, JSON encoding, " +
		"validated with protojson against a descriptor protocompile compiled at start) on shop.order.events, with, without; A, B, B, A; the mean of each side\n")
	fmt.Printf("# publish_p50_ms without %.2f ms, with %.2f ms, ratio %.3f; p99 without %.2f ms, with %.2f ms\n", offP50, onP50, onP50/offP50, offP99, onP99)
	printCPUOverhead("publish schema overhead", off, on)
	fmt.Printf("BENCH publish_schema_overhead_pct %.1f %%\n", (onP50-offP50)/offP50*100)
}
