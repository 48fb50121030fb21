package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// module is relaybus's module path.
const module = "github.com/relaybus/relaybus"

// engines are the packages a producer or a consumer links: they must stay
// free of what only a host needs.
var engines = []string{"./shared/relay", "./shared/consumer", "./shared/projection", "./shared/outbox", "./internal/inbox"}

// rule names what a package must not link and matches its import paths.
type rule struct {
	name  string
	match func(path string) bool
}

// prefix matches a module or package path and the packages below it.
func prefix(p string) rule { return rule{p, func(path string) bool { return under(path, p) }} }

// hostOnly are what an engine must not link: the cloud and broker clients
// (a user who enqueues through shared/outbox brings none), the
// OpenTelemetry SDK and exporters with gRPC and oauth2 under them (the
// engines record through the API; internal/otelsetup installs the SDK),
// and the ledger's Firestore write path (engines record through their own
// interfaces and take the ledger's types from its Firestore-free model
// package, internal/ledger/model).
var hostOnly = []rule{
	prefix("google.golang.org/grpc"),
	prefix("go.opentelemetry.io/otel/sdk"),
	prefix("go.opentelemetry.io/otel/exporters"),
	prefix("golang.org/x/oauth2"),
	prefix("cloud.google.com/go/pubsub"),
	prefix("github.com/nats-io"),
	{"Firestore", func(path string) bool { return strings.Contains(path, "firestore") }},
	{module + "/internal/ledger", func(path string) bool { return path == module+"/internal/ledger" }},
}

func TestEnginesLinkNoHostDependency(t *testing.T) {
	for _, pkg := range engines {
		t.Run(filepath.Base(pkg), func(t *testing.T) {
			g := load(t, pkg)
			for _, r := range hostOnly {
				if chain := g.find(func(p listed) bool { return r.match(p.ImportPath) }); chain != nil {
					t.Errorf("%s links %s: %s", pkg, r.name, strings.Join(chain, " -> "))
				}
			}
		})
	}
}

// The event model is a leaf: the standard library and relaybus's own
// packages only.
func TestEventLinksOnlyTheStandardLibrary(t *testing.T) {
	g := load(t, "./shared/event")
	if chain := g.find(func(p listed) bool { return !p.Standard && !under(p.ImportPath, module) }); chain != nil {
		t.Errorf("shared/event links a package outside the standard library: %s", strings.Join(chain, " -> "))
	}
}

// The Go client is an HTTP client: it writes CloudEvents over net/http
// itself.
func TestClientLinksNoCloudEventsSDKZapGRPCOrProtobuf(t *testing.T) {
	g := load(t, "./client")
	for _, prefix := range []string{"github.com/cloudevents", "go.uber.org/zap", "google.golang.org/grpc", "google.golang.org/protobuf"} {
		if chain := g.find(func(p listed) bool { return under(p.ImportPath, prefix) }); chain != nil {
			t.Errorf("client links %s: %s", prefix, strings.Join(chain, " -> "))
		}
	}
}

// The checks must see what they check: a graph in which the rule would
// find nothing because the listing is empty or wrong proves nothing.
func TestTheGraphHasTheImportsGoBuildLinks(t *testing.T) {
	g := load(t, "./shared/outbox")
	for _, want := range []string{"github.com/jackc/pgx/v5", module + "/shared/event", module + "/internal/traceparent", "go.opentelemetry.io/otel/trace"} {
		if g.find(func(p listed) bool { return p.ImportPath == want }) == nil {
			t.Errorf("go list -deps ./shared/outbox does not list %s", want)
		}
	}
	chain := g.find(func(p listed) bool { return p.ImportPath == "github.com/jackc/pgx/v5" })
	if len(chain) < 2 || chain[0] != module+"/shared/outbox" {
		t.Errorf("the chain to pgx starts at %v, want shared/outbox", chain)
	}
}

// listed is what go list -json says of a package.
type listed struct {
	ImportPath string
	Standard   bool
	Imports    []string
}

// graph is a package's dependencies, keyed by import path, and the root.
type graph struct {
	root string
	pkgs map[string]listed
}

// under says whether path is prefix or a package below it.
func under(path, prefix string) bool {
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// load lists pkg and every package it links (go list -deps -json, for the
// platform the functions ship on: linux/amd64, no cgo).
func load(t *testing.T, pkg string) graph {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Standard,Imports", pkg)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.Bytes())
	}
	g := graph{pkgs: map[string]listed{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		g.pkgs[p.ImportPath] = p
		g.root = p.ImportPath // -deps lists the package itself last
	}
	if len(g.pkgs) < 2 {
		t.Fatalf("go list -deps %s listed %d packages", pkg, len(g.pkgs))
	}
	return g
}

// find returns the shortest chain of imports from the root to the first
// package that matches bad (breadth first), or nil when none does.
func (g graph) find(bad func(listed) bool) []string {
	from := map[string]string{g.root: ""}
	queue := []string{g.root}
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
		p := g.pkgs[path]
		if bad(p) {
			var chain []string
			for at := path; at != ""; at = from[at] {
				chain = append([]string{at}, chain...)
			}
			return chain
		}
		for _, imp := range p.Imports {
			if _, seen := from[imp]; !seen {
				from[imp] = path
				queue = append(queue, imp)
			}
		}
	}
	return nil
}

// repoRoot is the module's root, two directories above this file.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller: no file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}
