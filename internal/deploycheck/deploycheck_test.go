package deploycheck_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/internal/deploycheck"
	"github.com/relaybus/relaybus/shared/topology"
)

func repo(t *testing.T) (string, *topology.Topology) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(filepath.Dir(file)))
	top, err := topology.Load(filepath.Join(root, "infra", "topology.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "infra", "terraform"), top
}

func tfvars(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "deploy.tfvars")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func checks(ps []deploycheck.Problem) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return strings.Join(out, "\n")
}

// The checks over the configuration, offline: each problem says what is
// wrong with its numbers and how to fix it; the repository's defaults and
// a sound tfvars pass.
func TestConfigurationChecks(t *testing.T) {
	dir, top := repo(t)
	run := func(body string) []deploycheck.Problem {
		t.Helper()
		ps, err := deploycheck.Run(context.Background(), deploycheck.Options{TerraformDir: dir, Topology: top, VarFiles: []string{tfvars(t, body)}})
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	if ps := run(`publish_invokers = ["user:me@example.com"]
operators = ["user:me@example.com"]
dlqreplay_settings = { writers = ["me@example.com"] }
`); len(ps) != 0 {
		t.Errorf("a sound configuration: %s", checks(ps))
	}
	for name, c := range map[string]struct{ body, want string }{
		"a misspelt variable": {`publish_invoker = ["user:me@example.com"]`, `tfvars: "publish_invoker" is not a variable of infra/terraform`},
		"pools above the instance": {`cloud_sql = { pool_max_conns = 10 }`,
			"connections: the pools can open 700 Postgres connections (main 550, member 150), above max_connections 400 minus 20 reserved"},
		"a tier too small for its max_connections": {`cloud_sql = { tier = "db-custom-1-3840", max_connections = 400 }`,
			"cloud_sql.max_connections 400 is more than twice the 100 Cloud SQL gives tier db-custom-1-3840 (3.8 GB)"},
		"a misspelt pull consumer": {`pull_mode = { enabled = true, consumers = ["shop.order.events.member-servce-processor"] }`,
			`pull_mode.consumers names "shop.order.events.member-servce-processor", which is no consumer of the topology`},
		"pull in flight beyond the pool": {`pull_mode = { enabled = true, max_in_flight = 16 }`,
			"pull_mode.max_in_flight 16 is above the pool of 5 connections"},
	} {
		got := checks(run(c.body))
		if !strings.Contains(got, c.want) || !strings.Contains(got, "fix: ") {
			t.Errorf("%s: %s\nwant %q and a fix", name, got, c.want)
		}
	}
	// External databases are not counted against Cloud SQL.
	if ps := run(`cloud_sql = { pool_max_conns = 10 }
database_url_secrets = { main = "main-url", member = "member-url" }`); len(ps) != 0 {
		t.Errorf("every database external: %s", checks(ps))
	}
}

// A topic may declare at most 19 versions with a Pub/Sub schema: the
// schema keeps one revision per version and the sync commits the newest
// once more, under Pub/Sub's 20.
func TestSchemaRevisionCount(t *testing.T) {
	dir, _ := repo(t)
	var b strings.Builder
	b.WriteString("rollup: {topic: relaybus.ledger.rollup}\ntopics:\n  - name: shop.order.events\n    schemas:\n")
	tdir := t.TempDir()
	_ = os.MkdirAll(filepath.Join(tdir, "schemas"), 0o755)
	for v := 1; v <= 20; v++ {
		f := fmt.Sprintf("schemas/v%d.proto", v)
		_ = os.WriteFile(filepath.Join(tdir, f), []byte(fmt.Sprintf(`syntax = "proto3"; package shop.v1; message Order { string id = 1; string f%d = 2; }`, v)), 0o644)
		fmt.Fprintf(&b, "      - {version: v%d, type: protobuf, file: %s, message: shop.v1.Order}\n", v, f)
	}
	b.WriteString("    consumers: [{service: billing}]\n")
	_ = os.WriteFile(filepath.Join(tdir, "topology.yaml"), []byte(b.String()), 0o644)
	top, err := topology.Load(filepath.Join(tdir, "topology.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ps, err := deploycheck.Run(context.Background(), deploycheck.Options{TerraformDir: dir, Topology: top})
	if err != nil {
		t.Fatal(err)
	}
	if got := checks(ps); !strings.Contains(got, "schemas: topic shop.order.events declares 20 schema versions: Pub/Sub keeps at most 20 revisions") {
		t.Errorf("20 versions: %s", got)
	}
}

// fakeGoogle answers the three REST calls the project checks make.
type fakeGoogle struct {
	enabled   map[string]bool
	bindings  map[string][]string // role -> members
	buckets   map[string]bool     // name -> versioned
	forbidden map[string]bool
	calls     []string
}

func (f *fakeGoogle) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.calls = append(f.calls, r.Method+" "+r.URL.Path)
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/v1/projects/p-1/services/"):
		svc := strings.TrimPrefix(r.URL.Path, "/v1/projects/p-1/services/")
		state := "DISABLED"
		if f.enabled[svc] {
			state = "ENABLED"
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"name": "projects/1/services/" + svc, "state": state})
	case r.Method == "POST" && r.URL.Path == "/v1/projects/p-1:getIamPolicy":
		var bs []map[string]any
		for role, members := range f.bindings {
			bs = append(bs, map[string]any{"role": role, "members": members})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"bindings": bs})
	case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/storage/v1/b/"):
		name := strings.TrimPrefix(r.URL.Path, "/storage/v1/b/")
		if f.forbidden[name] {
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"error": {"code": 403, "message": "no"}}`))
			return
		}
		versioned, ok := f.buckets[name]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error": {"code": 404, "message": "Not Found"}}`))
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"name": name, "versioning": map[string]any{"enabled": versioned}})
	default:
		http.NotFound(w, r)
	}
}

// The checks over the project, through the REST client against a fake
// Google: APIs that are off, the deploy account's missing roles and a
// missing or unversioned state bucket are each named with the gcloud
// command that fixes them; a ready project passes.
func TestProjectChecks(t *testing.T) {
	dir, top := repo(t)
	f := &fakeGoogle{enabled: map[string]bool{}, bindings: map[string][]string{}, buckets: map[string]bool{}, forbidden: map[string]bool{}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	cloud := deploycheck.REST{Client: srv.Client(), ServiceUsage: srv.URL, ResourceManager: srv.URL, Storage: srv.URL}
	run := func() string {
		t.Helper()
		ps, err := deploycheck.Run(context.Background(), deploycheck.Options{Project: "p-1", Region: "europe-west1", StateBucket: "p-1-tfstate",
			BuildAccount: "relaybus-deploy@p-1.iam.gserviceaccount.com", TerraformDir: dir, Topology: top, Cloud: cloud})
		if err != nil {
			t.Fatal(err)
		}
		return checks(ps)
	}
	got := run()
	for _, want := range []string{
		"apis: not enabled on p-1: cloudresourcemanager.googleapis.com, serviceusage.googleapis.com",
		"fix: gcloud services enable cloudresourcemanager.googleapis.com serviceusage.googleapis.com cloudbuild.googleapis.com artifactregistry.googleapis.com iam.googleapis.com --project=p-1",
		"build-account: relaybus-deploy@p-1.iam.gserviceaccount.com lacks 15 project role(s) the deploy needs: roles/logging.logWriter",
		"gcloud projects add-iam-policy-binding p-1 --member=serviceAccount:relaybus-deploy@p-1.iam.gserviceaccount.com --role=roles/monitoring.editor --condition=None",
		"state-bucket: gs://p-1-tfstate does not exist",
		"gcloud storage buckets create gs://p-1-tfstate --project=p-1 --location=europe-west1",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("an empty project: want %q in\n%s", want, got)
		}
	}
	for _, api := range deploycheck.RequiredAPIs {
		f.enabled[api] = true
	}
	for _, r := range deploycheck.DeployRoles[1:] {
		f.bindings[r] = []string{"serviceAccount:relaybus-deploy@p-1.iam.gserviceaccount.com", "user:someone@example.com"}
	}
	f.buckets["p-1-tfstate"] = false
	got = run()
	if strings.Contains(got, "apis:") || !strings.Contains(got, "lacks 1 project role(s) the deploy needs: roles/logging.logWriter") ||
		!strings.Contains(got, "state-bucket: gs://p-1-tfstate keeps no object versions") {
		t.Errorf("one role and versioning missing:\n%s", got)
	}
	f.bindings["roles/logging.logWriter"] = []string{"serviceAccount:relaybus-deploy@p-1.iam.gserviceaccount.com"}
	f.buckets["p-1-tfstate"] = true
	if got = run(); got != "" {
		t.Errorf("a ready project: %s", got)
	}
	f.forbidden["p-1-tfstate"] = true
	if got = run(); !strings.Contains(got, "does not exist (or the caller may not read it)") {
		t.Errorf("an unreadable bucket: %s", got)
	}
}
