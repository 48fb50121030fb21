// Package telemetrytest turns relaybus's telemetry on inside a test or a
// benchmark, as production runs it (the default sampler, a batching span
// processor, every metric aggregated) but with exports discarded, so that a
// run measures the instrumentation's in-process cost and not a network.
package telemetrytest

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	_ "google.golang.org/grpc/encoding/gzip" // the exporters compress

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/relaybus/relaybus/internal/telemetry"
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

// Sink is an OTLP/gRPC collector that counts what it receives and keeps
// nothing: a function in another process exports to it with telemetry on
// (OTEL_EXPORTER_OTLP_PROTOCOL=grpc, OTEL_EXPORTER_OTLP_ENDPOINT=Endpoint).
type Sink struct {
	coltrace.UnimplementedTraceServiceServer
	// Endpoint is its address as OTEL_EXPORTER_OTLP_ENDPOINT takes it.
	Endpoint string
	spans    atomic.Int64
}

// Spans is how many spans it has received.
func (s *Sink) Spans() int64 { return s.spans.Load() }

// Export counts the spans of one export.
func (s *Sink) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			s.spans.Add(int64(len(ss.Spans)))
		}
	}
	return &coltrace.ExportTraceServiceResponse{}, nil
}

type metricSink struct {
	colmetrics.UnimplementedMetricsServiceServer
}

func (metricSink) Export(context.Context, *colmetrics.ExportMetricsServiceRequest) (*colmetrics.ExportMetricsServiceResponse, error) {
	return &colmetrics.ExportMetricsServiceResponse{}, nil
}

// Collector starts a Sink for the test's duration.
func Collector(tb testing.TB) *Sink {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &Sink{Endpoint: "http://" + lis.Addr().String()}
	srv := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(srv, s)
	colmetrics.RegisterMetricsServiceServer(srv, metricSink{})
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	tb.Cleanup(srv.Stop)
	return s
}
