// Package telemetry is relaybus's OpenTelemetry: the process's tracer and
// meter providers, its sampling policy, the W3C trace context it stores
// with outbox rows and carries on Pub/Sub messages, and the instruments
// every hop records.
//
// Telemetry is off unless configured (Setup): then every hook in the hot
// paths is one atomic load and a return, and nothing is printed. It is on
// when OTEL_EXPORTER_OTLP_ENDPOINT names an OTLP/gRPC endpoint (a local
// collector, Jaeger, ...) or, on Cloud Run with a project, towards Google's
// Telemetry (OTLP) API, telemetry.googleapis.com, which takes traces and
// metrics in OTLP as they are: Google recommends it over the older Cloud
// Trace and Cloud Monitoring exporters, which convert OTLP into their own
// formats and may lose fields
// (https://cloud.google.com/trace/docs/migrate-to-otlp-endpoints,
// https://cloud.google.com/stackdriver/docs/reference/telemetry/overview).
// Metrics sent there land in Cloud Monitoring with the Prometheus mapping
// (https://cloud.google.com/stackdriver/docs/reference/telemetry/v1.metrics),
// so the dashboard queries them with PromQL.
//
// Sampling is relaybus's own (see Sampler): Cloud Run samples about 0.1
// request/s per instance of its own traces, so honoring an incoming
// request's sampled flag would drop almost everything.
package telemetry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/oauth2/google"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/oauth"
	_ "google.golang.org/grpc/encoding/gzip" // the exporters' compressor
)

// Export destinations (Config.Export).
const (
	// ExportAuto exports to OTEL_EXPORTER_OTLP_ENDPOINT when it is set, else
	// to Google when running on Cloud Run (K_SERVICE) with a project, else
	// nowhere.
	ExportAuto = "auto"
	// ExportOTLP exports to Endpoint (required).
	ExportOTLP = "otlp"
	// ExportGoogle exports to telemetry.googleapis.com with the
	// application default credentials.
	ExportGoogle = "google"
	// ExportOff turns telemetry off.
	ExportOff = "off"
)

// Defaults of Config.
const (
	DefaultSampleRatio    = 0.01
	DefaultMetricInterval = 60 * time.Second
	// GoogleEndpoint is the Telemetry (OTLP) API's gRPC endpoint.
	GoogleEndpoint = "telemetry.googleapis.com:443"
)

// Config is telemetry's environment (go-envconfig tags); embed it in a
// function's configuration.
type Config struct {
	// Export is auto, otlp, google or off (TELEMETRY_EXPORT, auto).
	Export string `env:"TELEMETRY_EXPORT, default=auto"`
	// Endpoint is an OTLP/gRPC endpoint, e.g. http://localhost:4317
	// (OTEL_EXPORTER_OTLP_ENDPOINT; the exporters also read the other
	// OTEL_EXPORTER_OTLP_* variables, headers and timeouts included).
	Endpoint string `env:"OTEL_EXPORTER_OTLP_ENDPOINT"`
	// SampleRatio is the share of traces relaybus records, decided at each
	// root from the trace id (TELEMETRY_SAMPLE_RATIO, 0.01; 1 records all).
	SampleRatio float64 `env:"TELEMETRY_SAMPLE_RATIO, default=0.01"`
	// MetricInterval is how often metrics are exported
	// (TELEMETRY_METRIC_INTERVAL, 60s; Cloud Monitoring accepts a point per
	// series at most every 5 s).
	MetricInterval time.Duration `env:"TELEMETRY_METRIC_INTERVAL, default=60s"`
	// CloudRunService is set on Cloud Run (K_SERVICE); ExportAuto exports
	// to Google only there.
	CloudRunService string `env:"K_SERVICE"`
}

// Options say what Setup sets up.
type Options struct {
	Config
	// ServiceName is the resource's service.name (the function's name).
	ServiceName string
	// ProjectID is the Google Cloud project (the quota project of exports
	// to Google).
	ProjectID string
}

// destination resolves o.Export to otlp, google or off.
func (o Options) destination() (string, error) {
	switch strings.ToLower(strings.TrimSpace(o.Export)) {
	case "", ExportAuto:
		switch {
		case o.Endpoint != "":
			return ExportOTLP, nil
		case o.CloudRunService != "" && o.ProjectID != "":
			return ExportGoogle, nil
		}
		return ExportOff, nil
	case ExportOTLP:
		if o.Endpoint == "" {
			return "", errors.New("telemetry: TELEMETRY_EXPORT=otlp needs OTEL_EXPORTER_OTLP_ENDPOINT")
		}
		return ExportOTLP, nil
	case ExportGoogle:
		if o.ProjectID == "" {
			return "", errors.New("telemetry: TELEMETRY_EXPORT=google needs GOOGLE_CLOUD_PROJECT")
		}
		return ExportGoogle, nil
	case ExportOff:
		return ExportOff, nil
	}
	return "", fmt.Errorf("telemetry: TELEMETRY_EXPORT: must be auto, otlp, google or off, not %q", o.Export)
}

// Shutdown flushes and stops what Setup started; call it in the graceful
// shutdown (it is what makes the last spans and points of an instance
// reach the backend before Cloud Run stops it).
type Shutdown func(ctx context.Context) error

// process is the one installation of the process: the functions of the
// local stack share it; the last Shutdown flushes it.
var process struct {
	sync.Mutex
	users    int
	shutdown Shutdown
}

// Setup installs the process's telemetry from o and returns its Shutdown.
// With nothing to export it installs nothing, prints nothing, and returns a
// Shutdown that does nothing. Several functions of one process (the local
// stack) may call it: the first call's exporters are shared, and the last
// Shutdown flushes them.
func Setup(ctx context.Context, o Options) (Shutdown, error) {
	dest, err := o.destination()
	if err != nil {
		return nil, err
	}
	if dest == ExportOff {
		return func(context.Context) error { return nil }, nil
	}
	if o.SampleRatio < 0 || o.SampleRatio > 1 {
		return nil, fmt.Errorf("telemetry: TELEMETRY_SAMPLE_RATIO: must be within [0, 1], not %v", o.SampleRatio)
	}
	process.Lock()
	defer process.Unlock()
	if process.users == 0 {
		sd, err := install(ctx, o, dest)
		if err != nil {
			return nil, err
		}
		process.shutdown = sd
	}
	process.users++
	var once sync.Once
	return func(ctx context.Context) error {
		var err error
		once.Do(func() {
			process.Lock()
			defer process.Unlock()
			process.users--
			if process.users == 0 {
				err = process.shutdown(ctx)
			}
		})
		return err
	}, nil
}

func install(ctx context.Context, o Options, dest string) (Shutdown, error) {
	var (
		topts []otlptracegrpc.Option
		mopts []otlpmetricgrpc.Option
	)
	if dest == ExportGoogle {
		// Application default credentials on every RPC, and the project as
		// the quota project (x-goog-user-project), as Google's Go sample for
		// the OTLP endpoint does.
		creds, err := google.FindDefaultCredentials(ctx, "https://www.googleapis.com/auth/cloud-platform")
		if err != nil {
			return nil, fmt.Errorf("telemetry: Google credentials: %w", err)
		}
		dial := grpc.WithPerRPCCredentials(oauth.TokenSource{TokenSource: creds.TokenSource})
		hdr := map[string]string{"x-goog-user-project": o.ProjectID}
		topts = append(topts, otlptracegrpc.WithEndpoint(GoogleEndpoint), otlptracegrpc.WithDialOption(dial), otlptracegrpc.WithHeaders(hdr))
		mopts = append(mopts, otlpmetricgrpc.WithEndpoint(GoogleEndpoint), otlpmetricgrpc.WithDialOption(dial), otlpmetricgrpc.WithHeaders(hdr))
	} else {
		topts = append(topts, otlptracegrpc.WithEndpointURL(o.Endpoint))
		mopts = append(mopts, otlpmetricgrpc.WithEndpointURL(o.Endpoint))
	}
	topts = append(topts, otlptracegrpc.WithCompressor("gzip"))
	mopts = append(mopts, otlpmetricgrpc.WithCompressor("gzip"))
	texp, err := otlptracegrpc.New(ctx, topts...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: trace exporter: %w", err)
	}
	mexp, err := otlpmetricgrpc.New(ctx, mopts...)
	if err != nil {
		_ = texp.Shutdown(ctx)
		return nil, fmt.Errorf("telemetry: metric exporter: %w", err)
	}
	res := Resource(o.ServiceName, o.ProjectID)
	tp := NewTracerProvider(o.SampleRatio, res, sdktrace.WithBatcher(texp))
	interval := o.MetricInterval
	if interval <= 0 {
		interval = DefaultMetricInterval
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res),
		sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp, sdkmetric.WithInterval(interval))))
	restore := Install(tp, mp)
	// The global tracer and propagator, so that the Google clients' gRPC
	// instrumentation puts Pub/Sub and Firestore calls under relaybus's
	// spans. The meter provider stays relaybus's own: no metric series but
	// those listed in the README.
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return func(ctx context.Context) error {
		restore()
		return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx))
	}, nil
}

// Resource describes the process: service.name, service.instance.id (a
// random id: every Cloud Run instance writes its own metric series, which
// the Telemetry API keeps apart by it, as Prometheus's instance label) and
// the project as gcp.project_id when known.
func Resource(service, project string) *resource.Resource {
	var id [8]byte
	_, _ = rand.Read(id[:])
	kvs := []attribute.KeyValue{attribute.String("service.name", service), attribute.String("service.instance.id", hex.EncodeToString(id[:]))}
	if project != "" {
		kvs = append(kvs, attribute.String("gcp.project_id", project))
	}
	r, err := resource.Merge(resource.Default(), resource.NewSchemaless(kvs...))
	if err != nil {
		return resource.NewSchemaless(kvs...)
	}
	return r
}

// NewTracerProvider is the SDK tracer provider relaybus uses: its Sampler
// at ratio and span limits within Cloud Trace's (32 attributes, values of
// at most 256 bytes,
// https://cloud.google.com/trace/docs/quotas#trace-limits), plus opts (an
// exporter; tests pass an in-memory one).
func NewTracerProvider(ratio float64, res *resource.Resource, opts ...sdktrace.TracerProviderOption) *sdktrace.TracerProvider {
	limits := sdktrace.NewSpanLimits()
	limits.AttributeCountLimit = 32
	limits.AttributeValueLengthLimit = 256
	limits.LinkCountLimit = 128
	base := []sdktrace.TracerProviderOption{sdktrace.WithSampler(Sampler(ratio)), sdktrace.WithSpanLimits(limits)}
	if res != nil {
		base = append(base, sdktrace.WithResource(res))
	}
	return sdktrace.NewTracerProvider(append(base, opts...)...)
}

// state is what the hooks record into; nil when telemetry is off.
type state struct {
	provider trace.TracerProvider
	tracer   trace.Tracer
	inst     *instruments
}

var current atomic.Pointer[state]

// Install makes tp and mp the providers relaybus's hooks record into and
// returns a function that puts back the previous ones. Setup calls it;
// tests call it with an in-memory exporter and a manual reader.
func Install(tp trace.TracerProvider, mp metric.MeterProvider) (restore func()) {
	s := &state{provider: tp, tracer: tp.Tracer(scope), inst: newInstruments(mp.Meter(scope))}
	prev := current.Swap(s)
	return func() { current.CompareAndSwap(s, prev) }
}

// scope is the instrumentation scope of relaybus's spans and metrics.
const scope = "github.com/relaybus/relaybus"

// Enabled reports whether telemetry is installed.
func Enabled() bool { return current.Load() != nil }
