// Package telemetrytest turns relaybus's telemetry on inside a test or a
// benchmark, as production runs it (the default sampler, a batching span
// processor, every metric aggregated) but with exports discarded, so that a
// run measures the instrumentation's in-process cost and not a network.
package telemetrytest

import (
	"context"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/relaybus/relaybus/shared/telemetry"
)

// discard is a span exporter that drops what it is given.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// On installs telemetry at ratio (telemetry.DefaultSampleRatio for the
// production default) and returns the function that turns it off again.
func On(ratio float64) (off func()) {
	tp := telemetry.NewTracerProvider(ratio, telemetry.Resource("bench", ""), sdktrace.WithBatcher(discard{}))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	restore := telemetry.Install(tp, mp)
	return func() {
		restore()
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	}
}
