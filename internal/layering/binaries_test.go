package layering

import (
	"strings"
	"testing"
)

// A binary links the backends its configuration can use and no others.
// The host opens each backend through an opener package of its own
// (internal/instance/pgopen, fsopen, brokeropen), and a function wires in
// only those it uses: rollup reads notices over HTTP (Pub/Sub pushes
// them) or pulls them from NATS (ROLLUP_MODE=pull) and writes Firestore,
// so it links no Postgres and no Pub/Sub client.
func TestBinariesLinkOnlyTheBackendsTheyUse(t *testing.T) {
	for _, c := range []struct {
		binary string
		not    []rule
	}{
		{"./functions/rollup/cmd", []rule{
			prefix("github.com/jackc/pgx"),
			prefix("github.com/exaring/otelpgx"),
			prefix("cloud.google.com/go/pubsub"),
			prefix(module + "/shared/postgres"),
			prefix(module + "/internal/pgpool"),
			prefix(module + "/internal/instance/pgopen"),
			prefix(module + "/internal/instance/brokeropen"),
			prefix("cloud.google.com/go/storage"),
			prefix(module + "/internal/instance/claimopen"),
		}},
		// The claim check's store (Cloud Storage) is opened by the
		// functions that publish or consume events only.
		{"./functions/dlqreplay/cmd", []rule{
			prefix("cloud.google.com/go/storage"),
			prefix(module + "/internal/instance/claimopen"),
		}},
		// The consume binary that ships registers relaybus's own handlers
		// only: a team links its handlers into a binary of its own
		// (consume.RegisterHandler, examples/loyalty); the demo's
		// handlers are the local stack's.
		{"./functions/consume/cmd", []rule{
			prefix(module + "/examples"),
			prefix(module + "/internal/devstack"),
		}},
	} {
		t.Run(strings.TrimPrefix(c.binary, "./functions/"), func(t *testing.T) {
			g := load(t, c.binary)
			for _, r := range c.not {
				if chain := g.find(func(p listed) bool { return r.match(p.ImportPath) }); chain != nil {
					t.Errorf("%s links %s: %s", c.binary, r.name, strings.Join(chain, " -> "))
				}
			}
		})
	}
}

// internal/telemetry is the instrumentation every engine records
// through: the OpenTelemetry API only. The pgx tracer lives beside the
// pools (internal/pgpool), so a package that records a span links no
// Postgres driver because of it.
func TestTelemetryLinksNoPostgresDriver(t *testing.T) {
	g := load(t, "./internal/telemetry")
	for _, r := range []rule{prefix("github.com/jackc/pgx"), prefix("github.com/exaring/otelpgx")} {
		if chain := g.find(func(p listed) bool { return r.match(p.ImportPath) }); chain != nil {
			t.Errorf("internal/telemetry links %s: %s", r.name, strings.Join(chain, " -> "))
		}
	}
}

// The binaries' checks must see what they check: each binary lists the
// function it serves and the backends it does use.
func TestTheBinariesGraphsListWhatTheyUse(t *testing.T) {
	for binary, wants := range map[string][]string{
		"./functions/rollup/cmd":  {module + "/functions/rollup", "cloud.google.com/go/firestore"},
		"./functions/consume/cmd": {module + "/functions/consume", "github.com/jackc/pgx/v5", "cloud.google.com/go/pubsub/v2", "github.com/nats-io/nats.go", "cloud.google.com/go/storage"},
		"./functions/relay/cmd":   {module + "/functions/relay", "cloud.google.com/go/storage"},
		"./functions/publish/cmd": {module + "/functions/publish", "cloud.google.com/go/storage"},
	} {
		g := load(t, binary)
		for _, want := range wants {
			if g.find(func(p listed) bool { return p.ImportPath == want }) == nil {
				t.Errorf("go list -deps %s does not list %s", binary, want)
			}
		}
	}
}
