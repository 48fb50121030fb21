package otelsetup_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/telemetry"
	"github.com/relaybus/relaybus/internal/traceparent"
)

func TestSamplerDecidesAtTheRootAndDeliveriesFollowTheProducer(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	parent := func(sampled, remote bool) context.Context {
		f := trace.TraceFlags(0)
		if sampled {
			f = trace.FlagsSampled
		}
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: f, Remote: remote})
		return trace.ContextWithSpanContext(context.Background(), sc)
	}
	sampledLink := trace.Link{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})}
	for _, c := range []struct {
		name  string
		ratio float64
		p     sdktrace.SamplingParameters
		want  sdktrace.SamplingDecision
	}{
		{"root, ratio 1", 1, sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: tid}, sdktrace.RecordAndSample},
		{"root, ratio 0", 0, sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: tid}, sdktrace.Drop},
		{"local sampled parent, ratio 0", 0, sdktrace.SamplingParameters{ParentContext: parent(true, false), TraceID: tid}, sdktrace.RecordAndSample},
		{"local unsampled parent, ratio 1", 1, sdktrace.SamplingParameters{ParentContext: parent(false, false), TraceID: tid}, sdktrace.Drop},
		// Cloud Run's sampled flag does not decide for a request, and an
		// unsampled caller does not stop it.
		{"request under a remote sampled parent, ratio 0", 0, sdktrace.SamplingParameters{ParentContext: parent(true, true), TraceID: tid, Kind: trace.SpanKindServer}, sdktrace.Drop},
		{"request under a remote unsampled parent, ratio 1", 1, sdktrace.SamplingParameters{ParentContext: parent(false, true), TraceID: tid, Kind: trace.SpanKindServer}, sdktrace.RecordAndSample},
		// A delivery follows its producer's decision.
		{"delivery of a sampled producer, ratio 0", 0, sdktrace.SamplingParameters{ParentContext: parent(true, true), TraceID: tid, Kind: trace.SpanKindConsumer}, sdktrace.RecordAndSample},
		{"delivery of an unsampled producer, ratio 1", 1, sdktrace.SamplingParameters{ParentContext: parent(false, true), TraceID: tid, Kind: trace.SpanKindConsumer}, sdktrace.Drop},
		{"delivery with no producer context, ratio 1", 1, sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: tid, Kind: trace.SpanKindConsumer}, sdktrace.RecordAndSample},
		{"forced root, ratio 0", 0, sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: tid,
			Attributes: []attributeKV{telemetry.ForceSample.Bool(true)}}, sdktrace.RecordAndSample},
		{"linked to a sampled span, ratio 0", 0, sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: tid,
			Links: []trace.Link{sampledLink}}, sdktrace.RecordAndSample},
	} {
		if got := otelsetup.Sampler(c.ratio).ShouldSample(c.p).Decision; got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// Every process decides the same for one trace: the share sampled is
	// the ratio, and a trace id's decision never changes.
	s1, s2 := otelsetup.Sampler(0.25), otelsetup.Sampler(0.25)
	gen := sdktraceIDs(4000)
	n := 0
	for _, id := range gen {
		p := sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: id}
		d1, d2 := s1.ShouldSample(p).Decision, s2.ShouldSample(p).Decision
		if d1 != d2 {
			t.Fatalf("trace %s: two samplers disagree", id)
		}
		if d1 == sdktrace.RecordAndSample {
			n++
		}
	}
	if share := float64(n) / float64(len(gen)); share < 0.2 || share > 0.3 {
		t.Errorf("ratio 0.25 sampled %.3f of the traces", share)
	}
}

func TestSetupWithNothingToExportInstallsNothing(t *testing.T) {
	for name, cfg := range map[string]otelsetup.Config{
		"no endpoint, not on Cloud Run": {Export: "auto"},
		"OTEL_SDK_DISABLED":             {Export: "auto", Endpoint: "http://127.0.0.1:4318", SDKDisabled: "TRUE"},
		"both exporters none":           {Export: "auto", Endpoint: "http://127.0.0.1:4318", TracesExporter: "none", MetricsExporter: "none"},
		"TELEMETRY_EXPORT=off":          {Export: "off", Endpoint: "http://127.0.0.1:4318"},
	} {
		sd, err := otelsetup.Setup(context.Background(), otelsetup.Options{Config: cfg, ServiceName: "x", ProjectID: "p"})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if telemetry.Enabled() {
			t.Errorf("%s: telemetry is on with nothing to export", name)
		}
		if err := sd(context.Background()); err != nil {
			t.Error(err)
		}
	}
	// A context with no span writes no traceparent.
	if tp := traceparent.FromContext(context.Background()); tp != "" {
		t.Errorf("traceparent %q", tp)
	}
	ctx, span := telemetry.Start(context.Background(), "x", telemetry.KindServer, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if span.Recording() || traceparent.FromContext(ctx) != "" {
		t.Error("a span started with telemetry off")
	}
}

func TestSetupRefusesABadConfigurationNamingTheVariable(t *testing.T) {
	ep := "http://127.0.0.1:4318"
	for _, c := range []struct {
		cfg  otelsetup.Config
		want string
	}{
		{otelsetup.Config{Export: "jaeger"}, "TELEMETRY_EXPORT: must be auto, otlp, google or off"},
		{otelsetup.Config{Export: "otlp"}, "needs OTEL_EXPORTER_OTLP_ENDPOINT"},
		{otelsetup.Config{Export: "google"}, "needs GOOGLE_CLOUD_PROJECT"},
		{otelsetup.Config{Endpoint: ep, Protocol: "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL: http/json is not supported"},
		{otelsetup.Config{Endpoint: ep, MetricsProtocol: "udp"}, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL: must be grpc or http/protobuf"},
		{otelsetup.Config{Endpoint: ep, TracesExporter: "zipkin"}, "OTEL_TRACES_EXPORTER: relaybus exports otlp or none"},
		{otelsetup.Config{Endpoint: ep, Sampler: "xray"}, "OTEL_TRACES_SAMPLER: \"xray\" is not supported"},
		{otelsetup.Config{Endpoint: ep, Sampler: "traceidratio", SamplerArg: "1.5"}, "OTEL_TRACES_SAMPLER_ARG: must be a ratio within [0, 1]"},
		{otelsetup.Config{Endpoint: ep, Sampler: "relaybus", SamplerArg: "half"}, "OTEL_TRACES_SAMPLER_ARG: must be a ratio within [0, 1]"},
		{otelsetup.Config{Endpoint: ep, MetricInterval: "60s"}, "OTEL_METRIC_EXPORT_INTERVAL: must be a positive number of milliseconds"},
		{otelsetup.Config{Endpoint: ep, MetricTimeout: "0"}, "OTEL_METRIC_EXPORT_TIMEOUT: must be a positive number of milliseconds"},
		{otelsetup.Config{Endpoint: ep, ResourceAttributes: "cloud.region"}, "OTEL_RESOURCE_ATTRIBUTES: \"cloud.region\" is not key=value"},
		{otelsetup.Config{MetricsEndpoint: ep}, "neither OTEL_EXPORTER_OTLP_TRACES_ENDPOINT nor OTEL_EXPORTER_OTLP_ENDPOINT is set"},
		{otelsetup.Config{Endpoint: ep, RetiredSampleRatio: "1"}, "TELEMETRY_SAMPLE_RATIO is no longer read: set OTEL_TRACES_SAMPLER=relaybus"},
		{otelsetup.Config{Endpoint: ep, RetiredMetricInterval: "60s"}, "TELEMETRY_METRIC_INTERVAL is no longer read: set OTEL_METRIC_EXPORT_INTERVAL"},
	} {
		_, err := otelsetup.Setup(context.Background(), otelsetup.Options{Config: c.cfg})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.cfg, err, c.want)
		}
	}
}

// TestTheStandardVariablesMeanWhatTheSpecificationSays: where each signal
// goes and how, from OTEL_EXPORTER_OTLP_*, OTEL_*_EXPORTER and
// OTEL_METRIC_EXPORT_*: http/protobuf by default with /v1/traces and
// /v1/metrics appended to the base endpoint, a signal's own endpoint used
// as it is, grpc as asked, per signal too; Google on Cloud Run with a
// project and no endpoint.
func TestTheStandardVariablesMeanWhatTheSpecificationSays(t *testing.T) {
	for name, c := range map[string]struct {
		o    otelsetup.Options
		want otelsetup.Resolved
	}{
		"base endpoint, default protocol": {otelsetup.Options{Config: otelsetup.Config{Endpoint: "http://collector:4318/"}},
			otelsetup.Resolved{Dest: "otlp", Traces: true, Metrics: true, TracesProtocol: "http/protobuf", MetricsProtocol: "http/protobuf",
				TracesURL: "http://collector:4318/v1/traces", MetricsURL: "http://collector:4318/v1/metrics", Interval: time.Minute, Timeout: 30 * time.Second}},
		"grpc": {otelsetup.Options{Config: otelsetup.Config{Endpoint: "http://collector:4317", Protocol: "grpc", MetricInterval: "2000", MetricTimeout: "1000"}},
			otelsetup.Resolved{Dest: "otlp", Traces: true, Metrics: true, TracesProtocol: "grpc", MetricsProtocol: "grpc",
				TracesURL: "http://collector:4317", MetricsURL: "http://collector:4317", Interval: 2 * time.Second, Timeout: time.Second}},
		"per-signal endpoints and protocols": {otelsetup.Options{Config: otelsetup.Config{Endpoint: "http://base:4318/otlp", TracesEndpoint: "https://traces.example/custom",
			Protocol: "grpc", MetricsProtocol: "http/protobuf"}},
			otelsetup.Resolved{Dest: "otlp", Traces: true, Metrics: true, TracesProtocol: "grpc", MetricsProtocol: "http/protobuf",
				TracesURL: "https://traces.example/custom", MetricsURL: "http://base:4318/otlp/v1/metrics", Interval: time.Minute, Timeout: 30 * time.Second}},
		"metrics only": {otelsetup.Options{Config: otelsetup.Config{MetricsEndpoint: "http://m:4318/v1/metrics", TracesExporter: "none"}},
			otelsetup.Resolved{Dest: "otlp", Metrics: true, TracesProtocol: "http/protobuf", MetricsProtocol: "http/protobuf",
				MetricsURL: "http://m:4318/v1/metrics", Interval: time.Minute, Timeout: 30 * time.Second}},
		"Cloud Run": {otelsetup.Options{Config: otelsetup.Config{CloudRunService: "relaybus-publish"}, ProjectID: "p"},
			otelsetup.Resolved{Dest: "google", Traces: true, Metrics: true, TracesProtocol: "http/protobuf", MetricsProtocol: "http/protobuf",
				Interval: time.Minute, Timeout: 30 * time.Second}},
		"Cloud Run, an endpoint wins": {otelsetup.Options{Config: otelsetup.Config{CloudRunService: "relaybus-publish", Endpoint: "http://c:4318"}, ProjectID: "p"},
			otelsetup.Resolved{Dest: "otlp", Traces: true, Metrics: true, TracesProtocol: "http/protobuf", MetricsProtocol: "http/protobuf",
				TracesURL: "http://c:4318/v1/traces", MetricsURL: "http://c:4318/v1/metrics", Interval: time.Minute, Timeout: 30 * time.Second}},
		"Cloud Run, OTEL_SDK_DISABLED": {otelsetup.Options{Config: otelsetup.Config{CloudRunService: "relaybus-publish", SDKDisabled: "true"}, ProjectID: "p"},
			otelsetup.Resolved{Off: true}},
		"OTEL_SDK_DISABLED=false": {otelsetup.Options{Config: otelsetup.Config{Endpoint: "http://c:4318", SDKDisabled: "false"}},
			otelsetup.Resolved{Dest: "otlp", Traces: true, Metrics: true, TracesProtocol: "http/protobuf", MetricsProtocol: "http/protobuf",
				TracesURL: "http://c:4318/v1/traces", MetricsURL: "http://c:4318/v1/metrics", Interval: time.Minute, Timeout: 30 * time.Second}},
	} {
		got, err := otelsetup.Resolve(c.o)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got != c.want {
			t.Errorf("%s:\n got %+v\nwant %+v", name, got, c.want)
		}
	}
}

// TestSamplersFromTheEnvironment: every OTEL_TRACES_SAMPLER value decides
// as the specification defines it for a root, a request continuing a
// sampled caller and one continuing an unsampled caller; relaybus's own
// policy ignores the caller's flag on a request and follows the producer
// on a delivery.
func TestSamplersFromTheEnvironment(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	remote := func(sampled bool) context.Context {
		f := trace.TraceFlags(0)
		if sampled {
			f = trace.FlagsSampled
		}
		return trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: f, Remote: true}))
	}
	S, D := sdktrace.RecordAndSample, sdktrace.Drop
	for _, c := range []struct {
		name, arg                                                  string
		root, sampledCaller, unsampledCaller, delivery1, delivery0 sdktrace.SamplingDecision
	}{
		{"", "", S, S, D, S, D}, // parentbased_always_on, the specification's default
		{"parentbased_always_on", "", S, S, D, S, D},
		{"always_on", "", S, S, S, S, S},
		{"always_off", "", D, D, D, D, D},
		{"parentbased_always_off", "", D, S, D, S, D},
		{"traceidratio", "0", D, D, D, D, D},
		{"traceidratio", "", S, S, S, S, S}, // the argument defaults to 1.0
		{"parentbased_traceidratio", "0", D, S, D, S, D},
		{"relaybus", "0", D, D, D, S, D},
		{"relaybus", "1", S, S, S, S, D},
	} {
		s, err := otelsetup.SamplerFromEnv(c.name, c.arg)
		if err != nil {
			t.Fatalf("%s %s: %v", c.name, c.arg, err)
		}
		for what, p := range map[string]struct {
			p    sdktrace.SamplingParameters
			want sdktrace.SamplingDecision
		}{
			"root":               {sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: tid, Kind: trace.SpanKindServer}, c.root},
			"sampled caller":     {sdktrace.SamplingParameters{ParentContext: remote(true), TraceID: tid, Kind: trace.SpanKindServer}, c.sampledCaller},
			"unsampled caller":   {sdktrace.SamplingParameters{ParentContext: remote(false), TraceID: tid, Kind: trace.SpanKindServer}, c.unsampledCaller},
			"sampled producer":   {sdktrace.SamplingParameters{ParentContext: remote(true), TraceID: tid, Kind: trace.SpanKindConsumer}, c.delivery1},
			"unsampled producer": {sdktrace.SamplingParameters{ParentContext: remote(false), TraceID: tid, Kind: trace.SpanKindConsumer}, c.delivery0},
		} {
			if got := s.ShouldSample(p.p).Decision; got != p.want {
				t.Errorf("OTEL_TRACES_SAMPLER=%q ARG=%q, %s: %v, want %v", c.name, c.arg, what, got, p.want)
			}
		}
	}
}

// TestResourceFromTheEnvironment: relaybus's attributes, then
// OTEL_RESOURCE_ATTRIBUTES (percent-decoded), then OTEL_SERVICE_NAME; on
// Cloud Run cloud.provider, cloud.platform, faas.name and faas.version,
// and cloud.region from the metadata server when the variables do not
// give it (the Telemetry API needs a location).
func TestResourceFromTheEnvironment(t *testing.T) {
	var asked atomic.Int32
	md := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/computeMetadata/v1/instance/region" || r.Header.Get("Metadata-Flavor") != "Google" {
			http.NotFound(w, r)
			return
		}
		asked.Add(1)
		w.Header().Set("Metadata-Flavor", "Google")
		_, _ = w.Write([]byte("projects/123456789/regions/europe-west4"))
	}))
	defer md.Close()
	t.Setenv("GCE_METADATA_HOST", strings.TrimPrefix(md.URL, "http://"))

	attrs := func(o otelsetup.Options) map[string]string {
		t.Helper()
		r, err := otelsetup.BuildResource(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, kv := range r.Attributes() {
			out[string(kv.Key)] = kv.Value.String()
		}
		return out
	}
	local := attrs(otelsetup.Options{ServiceName: "publish", Config: otelsetup.Config{ResourceAttributes: "service.name=shop-publish,team=a%2Cb , k = v"}})
	for k, want := range map[string]string{"service.name": "shop-publish", "team": "a,b", "k": "v", "telemetry.sdk.language": "go"} {
		if local[k] != want {
			t.Errorf("%s = %q, want %q (%v)", k, local[k], want, local)
		}
	}
	if _, ok := local["cloud.platform"]; ok || asked.Load() != 0 {
		t.Errorf("off Cloud Run: cloud.platform %q, metadata asked %d times", local["cloud.platform"], asked.Load())
	}
	if got := attrs(otelsetup.Options{ServiceName: "publish", Config: otelsetup.Config{ResourceAttributes: "service.name=a", ServiceName: "b"}})["service.name"]; got != "b" {
		t.Errorf("OTEL_SERVICE_NAME does not win over OTEL_RESOURCE_ATTRIBUTES: %s", got)
	}
	run := attrs(otelsetup.Options{ServiceName: "publish", ProjectID: "p-1", Config: otelsetup.Config{CloudRunService: "relaybus-publish", CloudRunRevision: "relaybus-publish-00002-abc"}})
	for k, want := range map[string]string{"service.name": "publish", "cloud.provider": "gcp", "cloud.platform": "gcp_cloud_run",
		"cloud.region": "europe-west4", "cloud.account.id": "p-1", "faas.name": "relaybus-publish", "faas.version": "relaybus-publish-00002-abc"} {
		if run[k] != want {
			t.Errorf("on Cloud Run: %s = %q, want %q", k, run[k], want)
		}
	}
	if run["service.instance.id"] == "" {
		t.Error("no service.instance.id")
	}
	n := asked.Load()
	given := attrs(otelsetup.Options{ServiceName: "publish", Config: otelsetup.Config{CloudRunService: "s", ResourceAttributes: "cloud.region=us-central1"}})
	if given["cloud.region"] != "us-central1" || asked.Load() != n {
		t.Errorf("cloud.region from OTEL_RESOURCE_ATTRIBUTES: %q, metadata asked again: %v", given["cloud.region"], asked.Load() != n)
	}
}

func TestEveryFunctionReadsTelemetryFromItsEnvironment(t *testing.T) {
	var env instance.Env
	look := envconfig.MapLookuper(map[string]string{"OTEL_TRACES_SAMPLER": "relaybus", "OTEL_TRACES_SAMPLER_ARG": "0.5",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		"OTEL_METRIC_EXPORT_INTERVAL": "5000", "OTEL_RESOURCE_ATTRIBUTES": "cloud.region=europe-west1", "OTEL_SDK_DISABLED": "false",
		"K_SERVICE": "publish", "K_REVISION": "publish-1"})
	if err := envconfig.ProcessWith(context.Background(), &envconfig.Config{Target: &env, Lookuper: look}); err != nil {
		t.Fatal(err)
	}
	want := otelsetup.Config{Export: "auto", Endpoint: "http://collector:4317", Protocol: "grpc", Sampler: "relaybus", SamplerArg: "0.5",
		MetricInterval: "5000", ResourceAttributes: "cloud.region=europe-west1", SDKDisabled: "false", CloudRunService: "publish", CloudRunRevision: "publish-1"}
	if env.Telemetry != want {
		t.Errorf("%+v, want %+v", env.Telemetry, want)
	}
}
