package pgpool

import (
	"strings"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/relaybus/relaybus/internal/telemetry"
)

// QueryTracer returns the pgx tracer that makes each Postgres statement a
// span under the caller's span (github.com/exaring/otelpgx), or nil when
// telemetry is off: set it as Config.Tracer when the pool is built, after
// the host installed telemetry (internal/otelsetup). A statement of a
// trace that is not sampled costs a context value and no span. Spans are
// named by StatementName; the SQL text is left out (relaybus's statements
// open with long comments, and Cloud Trace keeps 256 bytes of an
// attribute), and otelpgx's own metrics are off (the messaging metrics
// time the work that matters).
//
// It lives here, beside the pools, rather than in internal/telemetry, so
// that what records through internal/telemetry links no Postgres driver.
func QueryTracer() pgx.QueryTracer {
	tp := telemetry.TracerProvider()
	if tp == nil {
		return nil
	}
	return otelpgx.NewTracer(otelpgx.WithTracerProvider(tp), otelpgx.WithMeterProvider(noop.NewMeterProvider()),
		otelpgx.WithSpanNameFunc(StatementName), otelpgx.WithDisableSQLStatementInAttributes(),
		otelpgx.WithDisableConnectionDetailsInAttributes(), otelpgx.WithDisableAcquireTracer())
}

// StatementName names a statement's span: "pg " and the name its leading
// comment gives it ("-- Enqueue: insert the events ..." is "pg Enqueue",
// as relaybus's sql/*.sql files begin), else its first keyword ("pg
// SELECT"). The name is low-cardinality: never a value of the statement.
func StatementName(sql string) string {
	s := strings.TrimSpace(sql)
	if rest, ok := strings.CutPrefix(s, "--"); ok {
		line, _, _ := strings.Cut(rest, "\n")
		if name, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && name != "" && len(name) <= 40 {
			return "pg " + name
		}
	}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "--") {
			continue
		}
		word, _, _ := strings.Cut(line, " ")
		word = strings.TrimRight(word, "(;")
		if len(word) > 20 {
			word = word[:20]
		}
		return "pg " + strings.ToUpper(word)
	}
	return "pg"
}
