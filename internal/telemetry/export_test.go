package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/sdk/resource"
)

// Resolved is what Setup would install for o, for the tests.
type Resolved struct {
	Off                             bool
	Dest                            string
	Traces, Metrics                 bool
	TracesProtocol, MetricsProtocol string
	TracesURL, MetricsURL           string
	Interval, Timeout               time.Duration
}

func Resolve(o Options) (Resolved, error) {
	p, err := o.resolve()
	if err != nil || p == nil {
		return Resolved{Off: p == nil}, err
	}
	return Resolved{Dest: p.dest, Traces: p.traces, Metrics: p.metrics, TracesProtocol: p.tracesProtocol,
		MetricsProtocol: p.metricsProtocol, TracesURL: p.tracesURL, MetricsURL: p.metricsURL,
		Interval: p.interval, Timeout: p.timeout}, nil
}

func BuildResource(ctx context.Context, o Options) (*resource.Resource, error) {
	return buildResource(ctx, o)
}
