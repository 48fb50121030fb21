package telemetry_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/relaybus/relaybus/internal/reexec"
	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/telemetry"
)

// childRole makes the test binary a relaybus function served by
// instance.Main (see TestMain).
const childRole = "telemetry-child"

func TestMain(m *testing.M) {
	if role, _ := reexec.Role(); role == childRole {
		instance.Lazy("telemetry-child", buildChild)
		instance.Main("telemetry-child")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child is a function that records one span and one metric point per
// request, and flushes its telemetry when it closes.
type child struct{ flush telemetry.Shutdown }

func buildChild(ctx context.Context) (http.Handler, error) {
	var cfg instance.Env
	if err := envconfig.Process(ctx, &cfg); err != nil {
		return nil, err
	}
	flush, err := cfg.StartTelemetry(ctx, "telemetry-child")
	if err != nil {
		return nil, err
	}
	return &child{flush: flush}, nil
}

func (c *child) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, span := telemetry.Start(r.Context(), "child request", telemetry.KindServer, r.Header.Get("traceparent"))
	telemetry.RecordPublishRequest(ctx, http.StatusAccepted, time.Millisecond)
	span.End(nil)
	w.WriteHeader(http.StatusAccepted)
}

func (c *child) Close(ctx context.Context) error { return c.flush(ctx) }

// collector is an OTLP/gRPC collector that remembers span and metric names.
type collector struct {
	coltrace.UnimplementedTraceServiceServer
	colmetrics.UnimplementedMetricsServiceServer
	mu      sync.Mutex
	spans   []string
	metrics []string
}

func (c *collector) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.spans = append(c.spans, s.Name)
			}
		}
	}
	return &coltrace.ExportTraceServiceResponse{}, nil
}

type metricsCollector struct{ *collector }

func (c metricsCollector) Export(_ context.Context, req *colmetrics.ExportMetricsServiceRequest) (*colmetrics.ExportMetricsServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rm := range req.ResourceMetrics {
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				c.metrics = append(c.metrics, m.Name)
			}
		}
	}
	return &colmetrics.ExportMetricsServiceResponse{}, nil
}

// A function process exporting to a collector, stopped by SIGTERM as Cloud
// Run stops an instance: its graceful shutdown flushes the span and the
// metric point it holds (the batch delay and the metric interval are set
// far beyond the test, so only the flush can deliver them).
func TestSIGTERMFlushesWhatTheProcessHolds(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a process")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	srv := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(srv, col)
	colmetrics.RegisterMetricsServiceServer(srv, metricsCollector{col})
	go srv.Serve(lis) //nolint:errcheck
	defer srv.Stop()

	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := pl.Addr().(*net.TCPAddr).Port
	pl.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), reexec.Env(childRole, ""), fmt.Sprintf("PORT=%d", port),
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://"+lis.Addr().String(), "TELEMETRY_EXPORT=otlp", "TELEMETRY_SAMPLE_RATIO=1",
		"TELEMETRY_METRIC_INTERVAL=1h", "OTEL_BSP_SCHEDULE_DELAY=3600000", "K_SERVICE=")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck

	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	deadline := time.Now().Add(30 * time.Second)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		resp, err := http.Post(url, "application/json", nil)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				t.Fatalf("the function answered %d", resp.StatusCode)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the function never answered: %v", err)
		}
		time.Sleep(wait)
	}
	col.mu.Lock()
	before := len(col.spans) + len(col.metrics)
	col.mu.Unlock()
	if before != 0 {
		t.Fatalf("the collector had data before the shutdown (%d items): the test cannot tell a flush", before)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the function did not exit cleanly: %v", err)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if fmt.Sprint(col.spans) != "[child request]" {
		t.Errorf("spans flushed: %v, want [child request]", col.spans)
	}
	found := false
	for _, m := range col.metrics {
		found = found || m == telemetry.MetricPublishRequestDuration
	}
	if !found {
		t.Errorf("metrics flushed: %v, want %s", col.metrics, telemetry.MetricPublishRequestDuration)
	}
}
