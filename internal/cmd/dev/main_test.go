package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	colmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/internal/reexec"
	"github.com/relaybus/relaybus/internal/telemetry"
)

const devRole = "make-dev"

func TestMain(m *testing.M) {
	if role, _ := reexec.Role(); role == devRole {
		main()
		os.Exit(0)
	}
	code := m.Run()
	pgtest.Cleanup()
	emutest.Cleanup()
	os.Exit(code)
}

// otlpHTTP is an OTLP/HTTP receiver (the specification's default
// protocol): span names by trace id and span kind, and the names of the
// metrics with a data point.
type otlpHTTP struct {
	mu      sync.Mutex
	spans   map[string][]string // trace id -> "name [kind]"
	metrics map[string]bool
}

func (o *otlpHTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, _ := io.ReadAll(body)
	o.mu.Lock()
	defer o.mu.Unlock()
	var resp proto.Message
	switch r.URL.Path {
	case "/v1/traces":
		var m coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(raw, &m); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range m.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					id := hex.EncodeToString(s.TraceId)
					o.spans[id] = append(o.spans[id], s.Name+" ["+strings.ToLower(strings.TrimPrefix(s.Kind.String(), "SPAN_KIND_"))+"]")
				}
			}
		}
		resp = &coltrace.ExportTraceServiceResponse{}
	case "/v1/metrics":
		var m colmetrics.ExportMetricsServiceRequest
		if err := proto.Unmarshal(raw, &m); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rm := range m.ResourceMetrics {
			for _, sm := range rm.ScopeMetrics {
				for _, x := range sm.Metrics {
					if len(x.GetGauge().GetDataPoints())+len(x.GetSum().GetDataPoints())+len(x.GetHistogram().GetDataPoints()) > 0 {
						o.metrics[x.Name] = true
					}
				}
			}
		}
		resp = &colmetrics.ExportMetricsServiceResponse{}
	default:
		http.NotFound(w, r)
		return
	}
	out, _ := proto.Marshal(resp)
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (o *otlpHTTP) trace(id string) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.spans[id]...)
}

// make dev with only the standard OTEL_* variables set (an OTLP/HTTP
// endpoint, the default sampler and protocol, a metric interval of an
// hour) sends the collector every span of a purchase whose caller sampled
// it, and, when Ctrl-C stops it, its metrics (the outbox gauges that read
// the stack's pools included) before it exits 0. Before, the default ratio
// dropped the caller's sampled trace, only OTLP/gRPC was spoken, the final
// flush read the outbox gauges from closed pools and failed whole, and
// make dev exited 1.
func TestCtrlCExportsEverySignalAndExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole local stack")
	}
	col := &otlpHTTP{spans: map[string][]string{}, metrics: map[string]bool{}}
	srv := httptest.NewServer(col)
	defer srv.Close()

	dbURL := pgtest.Database(t)
	t.Cleanup(func() { dropBeside(dbURL, "member") })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^$", "-state", t.TempDir(), "-addr", addr, "-backoff-scale", "0.05")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") && !strings.HasPrefix(kv, "TELEMETRY_") && !strings.HasPrefix(kv, "K_") &&
			!strings.HasPrefix(kv, "DATABASE_URL") && !strings.HasPrefix(kv, "PUBSUB_EMULATOR_HOST=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, reexec.Env(devRole, ""), "DATABASE_URL="+dbURL,
		"FIRESTORE_EMULATOR_HOST="+emutest.Host(t, emulator.Firestore), "GOOGLE_CLOUD_PROJECT="+emutest.UniqueProject(t),
		"OTEL_EXPORTER_OTLP_ENDPOINT="+srv.URL, "OTEL_METRIC_EXPORT_INTERVAL=3600000", "LOG_LEVEL=error")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck
	ready := make(chan struct{})
	var out bytes.Buffer
	var outMu sync.Mutex
	go func() {
		sc := bufio.NewScanner(stdout)
		once := sync.Once{}
		for sc.Scan() {
			outMu.Lock()
			out.WriteString(sc.Text() + "\n")
			outMu.Unlock()
			if strings.HasPrefix(sc.Text(), "relaybus local stack ready") {
				once.Do(func() { close(ready) })
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(3 * time.Minute):
		t.Fatalf("make dev did not get ready\n%s", stderr.String())
	}

	traceID := "4bf92f3577b34da6a3ce929d0e0e" + fmt.Sprintf("%04x", time.Now().UnixNano()&0xffff)
	order := "order-" + traceID[28:]
	body, _ := json.Marshal(map[string]any{"eventType": "order.purchased", "topic": "shop.order.events", "aggregateId": order, "version": 1,
		"source": "order-service", "payload": map[string]any{"orderId": order, "memberId": "m-" + order, "amount": 42}})
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/publish", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("publish answered %d", resp.StatusCode)
	}

	// The purchase's spans, as the batch processor exports them (5 s): the
	// request, the relay's publish and both consumers' deliveries.
	want := []string{"publish [server]", "publish shop.order.events [producer]", "process shop.order.events [consumer]"}
	has := func(spans []string, name string, n int) bool {
		c := 0
		for _, s := range spans {
			if s == name {
				c++
			}
		}
		return c >= n
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		spans := col.trace(traceID)
		if has(spans, want[0], 1) && has(spans, want[1], 1) && has(spans, want[2], 2) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the collector got %v of trace %s, want %v (the consumer twice)\n%s", spans, traceID, want, stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Ctrl-C: the terminal signals the whole foreground process group.
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			outMu.Lock()
			defer outMu.Unlock()
			t.Fatalf("make dev exited with %v after Ctrl-C\n%s%s", err, out.String(), stderr.String())
		}
	case <-time.After(90 * time.Second):
		t.Fatal("make dev did not stop after Ctrl-C")
	}
	if strings.Contains(stderr.String(), "telemetry:") {
		t.Errorf("make dev reported a telemetry error:\n%s", stderr.String())
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	for _, m := range []string{telemetry.MetricPublishRequestDuration, telemetry.MetricConsumedMessages, telemetry.MetricHopDuration,
		telemetry.MetricOutboxPending, telemetry.MetricOutboxOldestAge} {
		if !col.metrics[m] {
			t.Errorf("no point of %s reached the collector (got %v)", m, col.metrics)
		}
	}
}

// dropBeside drops the database make dev created beside main's for name.
func dropBeside(mainURL, name string) {
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(mainURL)
	if err != nil {
		return
	}
	db := cfg.Database + "_" + name
	conn, err := pgx.Connect(ctx, mainURL)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
}
