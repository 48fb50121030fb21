package telemetry_test

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/reexec"
	"github.com/relaybus/relaybus/internal/telemetry"
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
// request, reports an outbox gauge that reads a "pool" it closes when it
// closes, and flushes its telemetry last.
type child struct {
	flush  telemetry.Shutdown
	closed atomic.Bool
}

func buildChild(ctx context.Context) (http.Handler, error) {
	var cfg instance.Env
	if err := envconfig.Process(ctx, &cfg); err != nil {
		return nil, err
	}
	flush, err := cfg.StartTelemetry(ctx, "telemetry-child")
	if err != nil {
		return nil, err
	}
	c := &child{flush: flush}
	telemetry.ObserveOutbox("main", func(context.Context) (telemetry.OutboxBacklog, error) {
		if c.closed.Load() {
			return telemetry.OutboxBacklog{}, errors.New("outbox: count: closed pool")
		}
		return telemetry.OutboxBacklog{Pending: 3}, nil
	})
	return c, nil
}

func (c *child) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, span := telemetry.Start(r.Context(), "child request", telemetry.KindServer, r.Header.Get("traceparent"))
	telemetry.RecordPublishRequest(ctx, http.StatusAccepted, time.Millisecond)
	span.End(nil)
	w.WriteHeader(http.StatusAccepted)
}

// Close closes the pool the gauge reads, then flushes.
func (c *child) Close(ctx context.Context) error {
	c.closed.Store(true)
	return c.flush(ctx)
}

// received is what a collector got: span names, the names of the metrics
// with at least one data point, and the resource attributes.
type received struct {
	mu       sync.Mutex
	spans    []string
	metrics  map[string]bool
	resource map[string]string
}

func (r *received) traces(req *coltrace.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		r.keep(rs.Resource)
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, s.Name)
			}
		}
	}
}

func (r *received) metricsOf(req *colmetrics.ExportMetricsServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.metrics == nil {
		r.metrics = map[string]bool{}
	}
	for _, rm := range req.ResourceMetrics {
		r.keep(rm.Resource)
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				n := len(m.GetGauge().GetDataPoints()) + len(m.GetSum().GetDataPoints()) + len(m.GetHistogram().GetDataPoints())
				if n > 0 {
					r.metrics[m.Name] = true
				}
			}
		}
	}
}

func (r *received) keep(res *resourcepb.Resource) {
	if r.resource == nil {
		r.resource = map[string]string{}
	}
	for _, kv := range res.GetAttributes() {
		r.resource[kv.Key] = kv.Value.GetStringValue()
	}
}

type grpcTraces struct {
	coltrace.UnimplementedTraceServiceServer
	r *received
}

func (g grpcTraces) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	g.r.traces(req)
	return &coltrace.ExportTraceServiceResponse{}, nil
}

type grpcMetrics struct {
	colmetrics.UnimplementedMetricsServiceServer
	r *received
}

func (g grpcMetrics) Export(_ context.Context, req *colmetrics.ExportMetricsServiceRequest) (*colmetrics.ExportMetricsServiceResponse, error) {
	g.r.metricsOf(req)
	return &colmetrics.ExportMetricsServiceResponse{}, nil
}

// grpcCollector is an OTLP/gRPC receiver; it returns its endpoint.
func grpcCollector(t *testing.T, r *received) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(srv, grpcTraces{r: r})
	colmetrics.RegisterMetricsServiceServer(srv, grpcMetrics{r: r})
	go srv.Serve(lis) //nolint:errcheck
	t.Cleanup(srv.Stop)
	return "http://" + lis.Addr().String()
}

// httpCollector is an OTLP/HTTP receiver (protobuf bodies, gzip or not, at
// /v1/traces and /v1/metrics); it returns its endpoint.
func httpCollector(t *testing.T, r *received) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		raw, err := io.ReadAll(body)
		if err != nil || req.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want a protobuf body", http.StatusBadRequest)
			return
		}
		var resp proto.Message
		switch req.URL.Path {
		case "/v1/traces":
			var m coltrace.ExportTraceServiceRequest
			if err := proto.Unmarshal(raw, &m); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.traces(&m)
			resp = &coltrace.ExportTraceServiceResponse{}
		case "/v1/metrics":
			var m colmetrics.ExportMetricsServiceRequest
			if err := proto.Unmarshal(raw, &m); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.metricsOf(&m)
			resp = &colmetrics.ExportMetricsServiceResponse{}
		default:
			http.NotFound(w, req)
			return
		}
		out, _ := proto.Marshal(resp)
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A function process set up with the standard OTEL_* variables only,
// exporting to an OTLP receiver in this process over gRPC and over
// OTLP/HTTP (the specification's default protocol), is stopped by SIGTERM
// as Cloud Run stops an instance long before its metric interval: its
// graceful shutdown exports the span of the request it served (continuing
// the caller's sampled traceparent) and its metrics, the outbox gauge
// included, read before the function closes the pool it reads. The batch
// delay and the metric interval are an hour, so only the shutdown can
// deliver them. Before, the gauge's read of the closed pool failed the
// final collection and no metric point ever left a short-lived process.
func TestSIGTERMFlushesWhatTheProcessHolds(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a process")
	}
	for _, proto := range []string{"grpc", "http/protobuf"} {
		t.Run(proto, func(t *testing.T) {
			r := &received{}
			env := []string{"OTEL_TRACES_SAMPLER=parentbased_always_on", "OTEL_METRIC_EXPORT_INTERVAL=3600000",
				"OTEL_BSP_SCHEDULE_DELAY=3600000", "K_SERVICE=telemetry-child", "K_REVISION=telemetry-child-00001",
				"OTEL_RESOURCE_ATTRIBUTES=cloud.region=europe-west1,deployment.environment.name=test"}
			if proto == "grpc" {
				env = append(env, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc", "OTEL_EXPORTER_OTLP_ENDPOINT="+grpcCollector(t, r))
			} else {
				env = append(env, "OTEL_EXPORTER_OTLP_ENDPOINT="+httpCollector(t, r)) // http/protobuf: the default
			}
			runChild(t, env)
			r.mu.Lock()
			defer r.mu.Unlock()
			if fmt.Sprint(r.spans) != "[child request]" {
				t.Errorf("spans flushed: %v, want [child request]", r.spans)
			}
			for _, m := range []string{telemetry.MetricPublishRequestDuration, telemetry.MetricOutboxPending, telemetry.MetricOutboxOldestAge} {
				if !r.metrics[m] {
					t.Errorf("metrics flushed: %v, want %s among them", sortedNames(r.metrics), m)
				}
			}
			for k, want := range map[string]string{"service.name": "telemetry-child", "cloud.platform": "gcp_cloud_run",
				"cloud.region": "europe-west1", "faas.name": "telemetry-child", "faas.version": "telemetry-child-00001",
				"deployment.environment.name": "test"} {
				if got := r.resource[k]; got != want {
					t.Errorf("resource %s = %q, want %q (%v)", k, got, want, r.resource)
				}
			}
		})
	}
}

func sortedNames(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// runChild runs the child function with env (and none of this process's
// telemetry variables), sends it one request with a sampled traceparent,
// stops it with SIGTERM and waits for a clean exit.
func runChild(t *testing.T, env []string) {
	t.Helper()
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := pl.Addr().(*net.TCPAddr).Port
	pl.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") && !strings.HasPrefix(kv, "TELEMETRY_") && !strings.HasPrefix(kv, "K_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, reexec.Env(childRole, ""), fmt.Sprintf("PORT=%d", port)), env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck

	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	deadline := time.Now().Add(30 * time.Second)
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		req, _ := http.NewRequest(http.MethodPost, url, nil)
		req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		resp, err := http.DefaultClient.Do(req)
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
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the function did not exit cleanly: %v", err)
	}
}
