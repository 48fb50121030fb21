package telemetry

// The host's half of the package: the OpenTelemetry SDK set up from the
// environment. Nothing here is called by an engine; the functions' hosts
// (internal/instance, the local stack's command) call Setup once per process
// and ForceFlush/Shutdown when they stop. It reads the standard variables
// as the OpenTelemetry specification defines them
// (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/,
// https://opentelemetry.io/docs/specs/otel/protocol/exporter/); relaybus's
// own settings exist only where the specification has none: where to
// export (TELEMETRY_EXPORT: Google's Telemetry API is not an OTLP endpoint
// one can name without credentials) and relaybus's sampling policy
// (OTEL_TRACES_SAMPLER=relaybus).

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/oauth2/google"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/oauth"
	_ "google.golang.org/grpc/encoding/gzip" // the gRPC exporters' compressor
)

// Export destinations (Config.Export, TELEMETRY_EXPORT).
const (
	// ExportAuto exports over OTLP when an OTEL_EXPORTER_OTLP_*ENDPOINT is
	// set, else to Google when running on Cloud Run (K_SERVICE) with a
	// project, else nowhere.
	ExportAuto = "auto"
	// ExportOTLP exports over OTLP to the OTEL_EXPORTER_OTLP_*ENDPOINT
	// variables (one of them required).
	ExportOTLP = "otlp"
	// ExportGoogle exports to telemetry.googleapis.com over OTLP/gRPC with
	// the application default credentials.
	ExportGoogle = "google"
	// ExportOff turns telemetry off.
	ExportOff = "off"
)

// OTLP protocols (OTEL_EXPORTER_OTLP_PROTOCOL and its per-signal forms).
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf"
	ProtocolHTTPJSON     = "http/json"
)

// Samplers (OTEL_TRACES_SAMPLER): the specification's, and relaybus's own.
const (
	SamplerAlwaysOn                = "always_on"
	SamplerAlwaysOff               = "always_off"
	SamplerTraceIDRatio            = "traceidratio"
	SamplerParentBasedAlwaysOn     = "parentbased_always_on"
	SamplerParentBasedAlwaysOff    = "parentbased_always_off"
	SamplerParentBasedTraceIDRatio = "parentbased_traceidratio"
	// SamplerRelaybus is relaybus's policy (see Sampler): decided at each
	// root by trace id at OTEL_TRACES_SAMPLER_ARG (DefaultSampleRatio when
	// unset), the caller's sampled flag ignored, deliveries following
	// their producer. Not a value of the specification: no sampler there
	// follows a remote parent for some span kinds and not others.
	SamplerRelaybus = "relaybus"
)

// Defaults.
const (
	// DefaultSampler is the specification's default sampler.
	DefaultSampler = SamplerParentBasedAlwaysOn
	// DefaultSampleRatio is SamplerRelaybus's ratio when
	// OTEL_TRACES_SAMPLER_ARG is unset.
	DefaultSampleRatio = 0.01
	// DefaultProtocol is the specification's default OTLP protocol.
	DefaultProtocol = ProtocolHTTPProtobuf
	// DefaultMetricInterval and DefaultMetricTimeout are the
	// specification's OTEL_METRIC_EXPORT_INTERVAL and
	// OTEL_METRIC_EXPORT_TIMEOUT defaults.
	DefaultMetricInterval = 60 * time.Second
	DefaultMetricTimeout  = 30 * time.Second
	// GoogleEndpoint is the Telemetry (OTLP) API's gRPC endpoint.
	GoogleEndpoint = "telemetry.googleapis.com:443"
)

// Config is telemetry's environment (go-envconfig tags); embed it in a
// function's configuration. Every field but Export is a variable of the
// OpenTelemetry specification or Cloud Run's, read as the specification
// says; values are kept as written and checked by Setup, which names the
// variable of a bad one.
type Config struct {
	// Export is auto, otlp, google or off (TELEMETRY_EXPORT, auto;
	// relaybus's own: see the Export* constants).
	Export string `env:"TELEMETRY_EXPORT, default=auto"`
	// SDKDisabled is OTEL_SDK_DISABLED: "true" (any case) turns telemetry
	// off, whatever else is set.
	SDKDisabled string `env:"OTEL_SDK_DISABLED"`
	// TracesExporter and MetricsExporter are OTEL_TRACES_EXPORTER and
	// OTEL_METRICS_EXPORTER: otlp (the default) or none.
	TracesExporter  string `env:"OTEL_TRACES_EXPORTER"`
	MetricsExporter string `env:"OTEL_METRICS_EXPORTER"`
	// Endpoint is OTEL_EXPORTER_OTLP_ENDPOINT, the base URL of both
	// signals (over HTTP /v1/traces and /v1/metrics are appended);
	// TracesEndpoint and MetricsEndpoint are the per-signal
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT and _METRICS_ENDPOINT, used as
	// they are. The exporters read the other OTEL_EXPORTER_OTLP_*
	// variables (headers, timeout, compression, certificates) themselves.
	Endpoint        string `env:"OTEL_EXPORTER_OTLP_ENDPOINT"`
	TracesEndpoint  string `env:"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"`
	MetricsEndpoint string `env:"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"`
	// Protocol is OTEL_EXPORTER_OTLP_PROTOCOL: grpc or http/protobuf (the
	// default); TracesProtocol and MetricsProtocol override it per signal.
	Protocol        string `env:"OTEL_EXPORTER_OTLP_PROTOCOL"`
	TracesProtocol  string `env:"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"`
	MetricsProtocol string `env:"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"`
	// Sampler is OTEL_TRACES_SAMPLER (parentbased_always_on when unset),
	// SamplerArg its OTEL_TRACES_SAMPLER_ARG.
	Sampler    string `env:"OTEL_TRACES_SAMPLER"`
	SamplerArg string `env:"OTEL_TRACES_SAMPLER_ARG"`
	// MetricInterval and MetricTimeout are OTEL_METRIC_EXPORT_INTERVAL and
	// OTEL_METRIC_EXPORT_TIMEOUT, in milliseconds (60000 and 30000).
	MetricInterval string `env:"OTEL_METRIC_EXPORT_INTERVAL"`
	MetricTimeout  string `env:"OTEL_METRIC_EXPORT_TIMEOUT"`
	// ResourceAttributes is OTEL_RESOURCE_ATTRIBUTES (key=value pairs,
	// comma-separated, values percent-encoded); ServiceName is
	// OTEL_SERVICE_NAME, which wins over service.name there.
	ResourceAttributes string `env:"OTEL_RESOURCE_ATTRIBUTES"`
	ServiceName        string `env:"OTEL_SERVICE_NAME"`
	// CloudRunService and CloudRunRevision are set by Cloud Run (K_SERVICE,
	// K_REVISION): ExportAuto exports to Google only there, and the
	// resource says cloud.platform gcp_cloud_run, faas.name and
	// faas.version.
	CloudRunService  string `env:"K_SERVICE"`
	CloudRunRevision string `env:"K_REVISION"`
	// RetiredSampleRatio and RetiredMetricInterval are the variables
	// relaybus read before it followed the specification
	// (TELEMETRY_SAMPLE_RATIO, TELEMETRY_METRIC_INTERVAL): Setup refuses
	// them, naming what replaces them, so that a setting is never silently
	// ignored.
	RetiredSampleRatio    string `env:"TELEMETRY_SAMPLE_RATIO"`
	RetiredMetricInterval string `env:"TELEMETRY_METRIC_INTERVAL"`
}

// Options say what Setup sets up.
type Options struct {
	Config
	// ServiceName is the resource's service.name unless OTEL_SERVICE_NAME
	// or OTEL_RESOURCE_ATTRIBUTES name one (the function's name).
	ServiceName string
	// ProjectID is the Google Cloud project: the quota project of exports
	// to Google, and the resource's cloud.account.id.
	ProjectID string
}

// plan is a Config checked and resolved: what install builds.
type plan struct {
	dest            string // ExportOTLP or ExportGoogle
	traces, metrics bool
	tracesProtocol  string
	metricsProtocol string
	tracesURL       string // OTLP only: the full URL of each signal
	metricsURL      string
	sampler         sdktrace.Sampler
	interval        time.Duration
	timeout         time.Duration
}

// resolve checks o and decides what to install; a nil plan means off.
func (o Options) resolve() (*plan, error) {
	c := o.Config
	if c.RetiredSampleRatio != "" {
		return nil, errors.New("telemetry: TELEMETRY_SAMPLE_RATIO is no longer read: set OTEL_TRACES_SAMPLER=relaybus and OTEL_TRACES_SAMPLER_ARG=<ratio> (relaybus's sampling policy), or another OTEL_TRACES_SAMPLER")
	}
	if c.RetiredMetricInterval != "" {
		return nil, errors.New("telemetry: TELEMETRY_METRIC_INTERVAL is no longer read: set OTEL_METRIC_EXPORT_INTERVAL in milliseconds (60000 is a minute)")
	}
	if strings.EqualFold(strings.TrimSpace(c.SDKDisabled), "true") {
		return nil, nil
	}
	p := &plan{}
	var err error
	if p.traces, err = exporterOn("OTEL_TRACES_EXPORTER", c.TracesExporter); err != nil {
		return nil, err
	}
	if p.metrics, err = exporterOn("OTEL_METRICS_EXPORTER", c.MetricsExporter); err != nil {
		return nil, err
	}
	otlpSet := c.Endpoint != "" || c.TracesEndpoint != "" || c.MetricsEndpoint != ""
	switch strings.ToLower(strings.TrimSpace(c.Export)) {
	case "", ExportAuto:
		switch {
		case otlpSet:
			p.dest = ExportOTLP
		case c.CloudRunService != "" && o.ProjectID != "":
			p.dest = ExportGoogle
		default:
			return nil, nil
		}
	case ExportOTLP:
		if !otlpSet {
			return nil, errors.New("telemetry: TELEMETRY_EXPORT=otlp needs OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT and _METRICS_ENDPOINT)")
		}
		p.dest = ExportOTLP
	case ExportGoogle:
		if o.ProjectID == "" {
			return nil, errors.New("telemetry: TELEMETRY_EXPORT=google needs GOOGLE_CLOUD_PROJECT")
		}
		p.dest = ExportGoogle
	case ExportOff:
		return nil, nil
	default:
		return nil, fmt.Errorf("telemetry: TELEMETRY_EXPORT: must be auto, otlp, google or off, not %q", c.Export)
	}
	if !p.traces && !p.metrics {
		return nil, nil
	}
	if p.tracesProtocol, err = protocol("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", c.TracesProtocol, c.Protocol); err != nil {
		return nil, err
	}
	if p.metricsProtocol, err = protocol("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", c.MetricsProtocol, c.Protocol); err != nil {
		return nil, err
	}
	if p.dest == ExportOTLP {
		p.tracesURL = signalURL(c.TracesEndpoint, c.Endpoint, p.tracesProtocol, "/v1/traces")
		p.metricsURL = signalURL(c.MetricsEndpoint, c.Endpoint, p.metricsProtocol, "/v1/metrics")
		if p.traces && p.tracesURL == "" {
			return nil, errors.New("telemetry: traces are exported over OTLP but neither OTEL_EXPORTER_OTLP_TRACES_ENDPOINT nor OTEL_EXPORTER_OTLP_ENDPOINT is set (set OTEL_TRACES_EXPORTER=none to export metrics only)")
		}
		if p.metrics && p.metricsURL == "" {
			return nil, errors.New("telemetry: metrics are exported over OTLP but neither OTEL_EXPORTER_OTLP_METRICS_ENDPOINT nor OTEL_EXPORTER_OTLP_ENDPOINT is set (set OTEL_METRICS_EXPORTER=none to export traces only)")
		}
	}
	if p.sampler, err = SamplerFromEnv(c.Sampler, c.SamplerArg); err != nil {
		return nil, err
	}
	if p.interval, err = millis("OTEL_METRIC_EXPORT_INTERVAL", c.MetricInterval, DefaultMetricInterval); err != nil {
		return nil, err
	}
	if p.timeout, err = millis("OTEL_METRIC_EXPORT_TIMEOUT", c.MetricTimeout, DefaultMetricTimeout); err != nil {
		return nil, err
	}
	return p, nil
}

// exporterOn reads OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER: otlp (the
// default) or none.
func exporterOn(name, v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "otlp":
		return true, nil
	case "none":
		return false, nil
	}
	return false, fmt.Errorf("telemetry: %s: relaybus exports otlp or none, not %q", name, v)
}

// protocol resolves a signal's OTLP protocol: its own variable, else
// OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf.
func protocol(name, signal, all string) (string, error) {
	v, from := strings.TrimSpace(signal), name
	if v == "" {
		v, from = strings.TrimSpace(all), "OTEL_EXPORTER_OTLP_PROTOCOL"
	}
	switch v {
	case "":
		return DefaultProtocol, nil
	case ProtocolGRPC, ProtocolHTTPProtobuf:
		return v, nil
	case ProtocolHTTPJSON:
		return "", fmt.Errorf("telemetry: %s: http/json is not supported by the Go metric exporter; use grpc or http/protobuf", from)
	}
	return "", fmt.Errorf("telemetry: %s: must be grpc or http/protobuf, not %q", from, v)
}

// signalURL is where one signal goes: its own endpoint as it is, else the
// base endpoint (over HTTP with the signal's path appended, as the
// specification says; over gRPC as it is).
func signalURL(own, base, proto, path string) string {
	if own != "" {
		return own
	}
	if base == "" {
		return ""
	}
	if proto == ProtocolGRPC {
		return base
	}
	return strings.TrimSuffix(base, "/") + path
}

// millis reads a duration in milliseconds, the specification's unit for
// OTEL_METRIC_EXPORT_*.
func millis(name, v string, def time.Duration) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("telemetry: %s: must be a positive number of milliseconds, not %q", name, v)
	}
	return time.Duration(n) * time.Millisecond, nil
}

// SamplerFromEnv is the sampler OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG name, as the specification defines them:
// always_on, always_off, traceidratio, parentbased_always_on (the default),
// parentbased_always_off, parentbased_traceidratio (the ratio variants'
// argument defaults to 1.0); and relaybus (see Sampler; its argument
// defaults to DefaultSampleRatio). An unknown name or an argument outside
// [0, 1] is an error naming the variable.
func SamplerFromEnv(name, arg string) (sdktrace.Sampler, error) {
	name = strings.ToLower(strings.TrimSpace(name))
	ratio := func(def float64) (float64, error) {
		a := strings.TrimSpace(arg)
		if a == "" {
			return def, nil
		}
		r, err := strconv.ParseFloat(a, 64)
		if err != nil || r < 0 || r > 1 {
			return 0, fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER_ARG: must be a ratio within [0, 1] for %s, not %q", name, arg)
		}
		return r, nil
	}
	switch name {
	case "", SamplerParentBasedAlwaysOn:
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case SamplerAlwaysOn:
		return sdktrace.AlwaysSample(), nil
	case SamplerAlwaysOff:
		return sdktrace.NeverSample(), nil
	case SamplerParentBasedAlwaysOff:
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case SamplerTraceIDRatio:
		r, err := ratio(1)
		if err != nil {
			return nil, err
		}
		return sdktrace.TraceIDRatioBased(r), nil
	case SamplerParentBasedTraceIDRatio:
		r, err := ratio(1)
		if err != nil {
			return nil, err
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), nil
	case SamplerRelaybus:
		r, err := ratio(DefaultSampleRatio)
		if err != nil {
			return nil, err
		}
		return Sampler(r), nil
	}
	return nil, fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER: %q is not supported; use always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio or relaybus", name)
}

// Shutdown flushes and stops what Setup started; call it in the graceful
// shutdown, after the function closed.
type Shutdown func(ctx context.Context) error

// process is the one installation of the process: the functions of the
// local stack share it; the last Shutdown flushes it.
var process struct {
	sync.Mutex
	users    int
	shutdown Shutdown
	flush    func(ctx context.Context) error
}

// Setup installs the process's telemetry from o and returns its Shutdown.
// With nothing to export it installs nothing, prints nothing, and returns a
// Shutdown that does nothing. Several functions of one process (the local
// stack) may call it: the first call's exporters are shared, and the last
// Shutdown flushes them. A bad setting is an error naming its variable.
func Setup(ctx context.Context, o Options) (Shutdown, error) {
	p, err := o.resolve()
	if err != nil {
		return nil, err
	}
	if p == nil {
		return func(context.Context) error { return nil }, nil
	}
	process.Lock()
	defer process.Unlock()
	if process.users == 0 {
		if err := install(ctx, o, p); err != nil {
			return nil, err
		}
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
				process.shutdown, process.flush = nil, nil
			}
		})
		return err
	}, nil
}

// ForceFlush exports what the process's telemetry holds now: the spans
// batched and a collection of every metric, the gauges included. The host
// calls it after the last request and before the function closes its
// pools, so the last points of an instance that lives less than the
// export interval (a Cloud Run instance scaled to zero) reach the backend
// while the gauges can still read them. Without Setup it does nothing.
func ForceFlush(ctx context.Context) error {
	process.Lock()
	flush := process.flush
	process.Unlock()
	if flush == nil {
		return nil
	}
	return flush(ctx)
}

func install(ctx context.Context, o Options, p *plan) error {
	res, err := buildResource(ctx, o)
	if err != nil {
		return err
	}
	var (
		tp    trace.TracerProvider = tracenoop.NewTracerProvider()
		mp    metric.MeterProvider = metricnoop.NewMeterProvider()
		stops []func(context.Context) error
		flush []func(context.Context) error
	)
	fail := func(err error) error {
		for _, s := range stops {
			_ = s(ctx)
		}
		return err
	}
	if p.traces {
		exp, err := traceExporter(ctx, o, p)
		if err != nil {
			return fail(fmt.Errorf("telemetry: trace exporter: %w", err))
		}
		sdk := newTracerProvider(p.sampler, res, sdktrace.WithBatcher(exp))
		tp = sdk
		stops, flush = append(stops, sdk.Shutdown), append(flush, sdk.ForceFlush)
	}
	if p.metrics {
		exp, err := metricExporter(ctx, o, p)
		if err != nil {
			return fail(fmt.Errorf("telemetry: metric exporter: %w", err))
		}
		sdk := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res),
			sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(p.interval), sdkmetric.WithTimeout(p.timeout))))
		mp = sdk
		stops, flush = append(stops, sdk.Shutdown), append(flush, sdk.ForceFlush)
	}
	restore := Install(tp, mp)
	// The global tracer and propagator, so that the Google clients' gRPC
	// instrumentation puts Pub/Sub and Firestore calls under relaybus's
	// spans. The meter provider stays relaybus's own: no metric series but
	// those documented.
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	process.flush = func(ctx context.Context) error {
		var errs []error
		for _, f := range flush {
			errs = append(errs, f(ctx))
		}
		return errors.Join(errs...)
	}
	process.shutdown = func(ctx context.Context) error {
		restore()
		var errs []error
		for _, s := range stops {
			errs = append(errs, s(ctx))
		}
		return errors.Join(errs...)
	}
	return nil
}

// googleDial is the gRPC credentials and quota project of exports to
// Google: application default credentials on every RPC, and the project
// as x-goog-user-project, as Google's sample for the OTLP endpoint does
// (the sender then needs serviceusage.services.use on it).
func googleDial(ctx context.Context, project string) (grpc.DialOption, map[string]string, error) {
	creds, err := google.FindDefaultCredentials(ctx, "https://www.googleapis.com/auth/cloud-platform")
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: Google credentials: %w", err)
	}
	return grpc.WithPerRPCCredentials(oauth.TokenSource{TokenSource: creds.TokenSource}), map[string]string{"x-goog-user-project": project}, nil
}

func traceExporter(ctx context.Context, o Options, p *plan) (sdktrace.SpanExporter, error) {
	if p.dest == ExportGoogle {
		dial, hdr, err := googleDial(ctx, o.ProjectID)
		if err != nil {
			return nil, err
		}
		return otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(GoogleEndpoint), otlptracegrpc.WithDialOption(dial),
			otlptracegrpc.WithHeaders(hdr), otlptracegrpc.WithCompressor("gzip"))
	}
	if p.tracesProtocol == ProtocolGRPC {
		return otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(p.tracesURL))
	}
	return otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(p.tracesURL))
}

func metricExporter(ctx context.Context, o Options, p *plan) (sdkmetric.Exporter, error) {
	if p.dest == ExportGoogle {
		dial, hdr, err := googleDial(ctx, o.ProjectID)
		if err != nil {
			return nil, err
		}
		return otlpmetricgrpc.New(ctx, otlpmetricgrpc.WithEndpoint(GoogleEndpoint), otlpmetricgrpc.WithDialOption(dial),
			otlpmetricgrpc.WithHeaders(hdr), otlpmetricgrpc.WithCompressor("gzip"))
	}
	if p.metricsProtocol == ProtocolGRPC {
		return otlpmetricgrpc.New(ctx, otlpmetricgrpc.WithEndpointURL(p.metricsURL))
	}
	return otlpmetrichttp.New(ctx, otlpmetrichttp.WithEndpointURL(p.metricsURL))
}

// NewTracerProvider is the SDK tracer provider relaybus uses with its own
// Sampler at ratio, plus opts (an exporter; tests pass an in-memory one).
func NewTracerProvider(ratio float64, res *resource.Resource, opts ...sdktrace.TracerProviderOption) *sdktrace.TracerProvider {
	return newTracerProvider(Sampler(ratio), res, opts...)
}

// newTracerProvider is the SDK tracer provider with sampler and span
// limits within Cloud Trace's (32 attributes, values of at most 256 bytes,
// https://cloud.google.com/trace/docs/quotas#trace-limits).
func newTracerProvider(sampler sdktrace.Sampler, res *resource.Resource, opts ...sdktrace.TracerProviderOption) *sdktrace.TracerProvider {
	limits := sdktrace.NewSpanLimits()
	limits.AttributeCountLimit = 32
	limits.AttributeValueLengthLimit = 256
	limits.LinkCountLimit = 128
	base := []sdktrace.TracerProviderOption{sdktrace.WithSampler(sampler), sdktrace.WithRawSpanLimits(limits)}
	if res != nil {
		base = append(base, sdktrace.WithResource(res))
	}
	return sdktrace.NewTracerProvider(append(base, opts...)...)
}
