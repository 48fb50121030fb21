package layering

import (
	"sort"
	"strings"
	"testing"
)

// maxOverPgx is how many packages a program that enqueues through
// shared/outbox may link beyond the same program writing its row with
// pgx alone: relaybus's own (the outbox, the event model, migrations,
// the traceparent) and the OpenTelemetry trace API the traceparent is
// read through.
const maxOverPgx = 30

// A producer that enqueues (examples/enqueue) links pgx, the outbox and
// the OpenTelemetry trace API, and nothing a host needs: no exporter,
// SDK, gRPC, oauth2, cloud or broker client, no statement tracer, no
// retry library, and no HTTP stack.
func TestEnqueueLinksLittleBeyondPgx(t *testing.T) {
	enqueue := load(t, "./examples/enqueue")
	baseline := load(t, "./internal/layering/testdata/pgxonly")
	if baseline.find(func(p listed) bool { return p.ImportPath == "github.com/jackc/pgx/v5/pgxpool" }) == nil {
		t.Fatal("the pgx-only baseline does not link pgxpool: it measures nothing")
	}
	for _, r := range append(hostOnly,
		prefix("github.com/exaring/otelpgx"),
		prefix("github.com/cenkalti/backoff"),
		rule{"go.opentelemetry.io/otel (the global providers and propagators)", func(path string) bool { return path == "go.opentelemetry.io/otel" }},
		prefix("net/http"),
	) {
		if chain := enqueue.find(func(p listed) bool { return r.match(p.ImportPath) }); chain != nil {
			t.Errorf("examples/enqueue links %s: %s", r.name, strings.Join(chain, " -> "))
		}
	}
	var extra []string
	for path := range enqueue.pkgs {
		if _, ok := baseline.pkgs[path]; !ok {
			extra = append(extra, path)
		}
	}
	sort.Strings(extra)
	if len(extra) > maxOverPgx {
		t.Errorf("examples/enqueue links %d packages beyond pgx alone, more than %d:\n%s", len(extra), maxOverPgx, strings.Join(extra, "\n"))
	}
	if enqueue.find(func(p listed) bool { return p.ImportPath == module+"/shared/outbox" }) == nil {
		t.Error("examples/enqueue does not link shared/outbox: it measures nothing")
	}
}
