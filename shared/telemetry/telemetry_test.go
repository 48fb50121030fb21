package telemetry_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sethvargo/go-envconfig"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/telemetry"
)

func TestTraceparentRoundTripsAndRefusesWhatW3CRefuses(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sc, ok := telemetry.ParseTraceparent(tp)
	if !ok || !sc.IsRemote() || !sc.IsSampled() || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sc.SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("parse %s: %v %v", tp, sc, ok)
	}
	if got := telemetry.FormatTraceparent(sc); got != tp {
		t.Errorf("format: %s, want %s", got, tp)
	}
	if got := telemetry.FormatTraceparent(trace.SpanContext{}); got != "" {
		t.Errorf("format of no span: %q", got)
	}
	for _, bad := range []string{
		"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", // too short
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // version ff
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // zero span id
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   // upper case
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", // version 00 with more
		"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	} {
		if _, ok := telemetry.ParseTraceparent(bad); ok {
			t.Errorf("%q parsed as valid", bad)
		}
	}
	// A future version may append fields.
	if _, ok := telemetry.ParseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra"); !ok {
		t.Error("a future version's traceparent was refused")
	}
}

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
		if got := telemetry.Sampler(c.ratio).ShouldSample(c.p).Decision; got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// Every process decides the same for one trace: the share sampled is
	// the ratio, and a trace id's decision never changes.
	s1, s2 := telemetry.Sampler(0.25), telemetry.Sampler(0.25)
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
	sd, err := telemetry.Setup(context.Background(), telemetry.Options{Config: telemetry.Config{Export: "auto", SampleRatio: 0.01}, ServiceName: "x", ProjectID: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if telemetry.Enabled() {
		t.Error("telemetry is on with nothing to export")
	}
	if err := sd(context.Background()); err != nil {
		t.Error(err)
	}
	// A context with no span writes no traceparent.
	if tp := telemetry.Traceparent(context.Background()); tp != "" {
		t.Errorf("traceparent %q", tp)
	}
	ctx, span := telemetry.Start(context.Background(), "x", telemetry.KindServer, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if span.Recording() || telemetry.Traceparent(ctx) != "" {
		t.Error("a span started with telemetry off")
	}
}

func TestSetupRefusesABadConfigurationNamingTheVariable(t *testing.T) {
	for _, c := range []struct {
		o    telemetry.Options
		want string
	}{
		{telemetry.Options{Config: telemetry.Config{Export: "jaeger"}}, "TELEMETRY_EXPORT: must be auto, otlp, google or off"},
		{telemetry.Options{Config: telemetry.Config{Export: "otlp"}}, "needs OTEL_EXPORTER_OTLP_ENDPOINT"},
		{telemetry.Options{Config: telemetry.Config{Export: "google"}}, "needs GOOGLE_CLOUD_PROJECT"},
		{telemetry.Options{Config: telemetry.Config{Endpoint: "http://127.0.0.1:4317", SampleRatio: 1.5}}, "TELEMETRY_SAMPLE_RATIO: must be within [0, 1]"},
	} {
		_, err := telemetry.Setup(context.Background(), c.o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.o.Config, err, c.want)
		}
	}
}

func TestEveryFunctionReadsTelemetryFromItsEnvironment(t *testing.T) {
	var env instance.Env
	look := envconfig.MapLookuper(map[string]string{"TELEMETRY_SAMPLE_RATIO": "0.5", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "K_SERVICE": "publish"})
	if err := envconfig.ProcessWith(context.Background(), &envconfig.Config{Target: &env, Lookuper: look}); err != nil {
		t.Fatal(err)
	}
	want := telemetry.Config{Export: "auto", Endpoint: "http://collector:4317", SampleRatio: 0.5, MetricInterval: telemetry.DefaultMetricInterval, CloudRunService: "publish"}
	if env.Telemetry != want {
		t.Errorf("%+v, want %+v", env.Telemetry, want)
	}
	env = instance.Env{}
	if err := envconfig.ProcessWith(context.Background(), &envconfig.Config{Target: &env, Lookuper: envconfig.MapLookuper(nil)}); err != nil {
		t.Fatal(err)
	}
	if env.Telemetry.SampleRatio != telemetry.DefaultSampleRatio {
		t.Errorf("default ratio %v, want %v", env.Telemetry.SampleRatio, telemetry.DefaultSampleRatio)
	}
}

func TestStatementNamesAreLowCardinality(t *testing.T) {
	for sql, want := range map[string]string{
		"-- Enqueue: insert the events (an id already in the outbox is skipped) and,\n-- in the same statement\nWITH ins AS (...)": "pg Enqueue",
		"-- Claim re-pushes: lease up to $3 due re-pushes\nWITH t AS (SELECT 1)":                                                   "pg Claim re-pushes",
		"-- a comment without a name\nSELECT id FROM relaybus_outbox WHERE id = 'e-123'":                                           "pg SELECT",
		"  insert into t values (1)": "pg INSERT",
		"begin":                      "pg BEGIN",
		"SELECT count(*) FROM t":     "pg SELECT",
		"":                           "pg",
	} {
		if got := telemetry.StatementName(sql); got != want {
			t.Errorf("%q: %q, want %q", sql, got, want)
		}
	}
}
