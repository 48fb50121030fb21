package layering

import (
	"strings"
	"testing"
)

// internal/telemetry is the instrumentation every engine records
// through: the OpenTelemetry API only. The pgx tracer lives beside the
// pools (internal/postgres), so a package that records a span links no
// Postgres driver because of it.
func TestTelemetryLinksNoPostgresDriver(t *testing.T) {
	g := load(t, "./internal/telemetry")
	for _, r := range []rule{prefix("github.com/jackc/pgx"), prefix("github.com/exaring/otelpgx")} {
		if chain := g.find(func(p listed) bool { return r.match(p.ImportPath) }); chain != nil {
			t.Errorf("internal/telemetry links %s: %s", r.name, strings.Join(chain, " -> "))
		}
	}
}
