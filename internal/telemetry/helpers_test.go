package telemetry_test

import (
	"encoding/binary"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

type attributeKV = attribute.KeyValue

// sdktraceIDs returns n trace ids spread like random ones (a fixed
// sequence, so the test is repeatable).
func sdktraceIDs(n int) []trace.TraceID {
	out := make([]trace.TraceID, n)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range out {
		// splitmix64
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		binary.BigEndian.PutUint64(out[i][:8], z)
		binary.BigEndian.PutUint64(out[i][8:], z*31+7)
	}
	return out
}
