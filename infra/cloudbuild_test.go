package infra

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// functionNames are the function directories under functions/.
func functionNames(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(repoRoot(t), "functions"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	if len(out) == 0 {
		t.Fatal("no functions under functions/")
	}
	return out
}

type buildStep struct {
	ID         string   `yaml:"id"`
	Name       string   `yaml:"name"`
	WaitFor    []string `yaml:"waitFor"`
	Entrypoint string   `yaml:"entrypoint"`
	Args       []string `yaml:"args"`
	Dir        string   `yaml:"dir"`
	Env        []string `yaml:"env"`
}

// TestCloudBuildStepGraph: unique ids, known waitFor targets, no cycle,
// test before every build, one build and push per function, deploy after
// every push with the commit's image tag, every substitution declared.
func TestCloudBuildStepGraph(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "cloudbuild.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cb struct {
		Steps         []buildStep       `yaml:"steps"`
		Substitutions map[string]string `yaml:"substitutions"`
	}
	if err := yaml.Unmarshal(raw, &cb); err != nil {
		t.Fatalf("cloudbuild.yaml: %v", err)
	}
	steps := map[string]buildStep{}
	var order []string
	for i, s := range cb.Steps {
		if s.ID == "" {
			t.Fatalf("step %d has no id", i)
		}
		if _, dup := steps[s.ID]; dup {
			t.Errorf("step id %s twice", s.ID)
		}
		steps[s.ID] = s
		order = append(order, s.ID)
	}
	// Cloud Build: no waitFor = wait for every earlier step; "-" = start at once.
	deps := map[string][]string{}
	for i, id := range order {
		s := steps[id]
		switch {
		case s.WaitFor == nil:
			deps[id] = append([]string(nil), order[:i]...)
		case len(s.WaitFor) == 1 && s.WaitFor[0] == "-":
		default:
			for _, w := range s.WaitFor {
				if _, ok := steps[w]; !ok {
					t.Errorf("step %s waits for unknown step %s", id, w)
				}
				deps[id] = append(deps[id], w)
			}
		}
	}
	// Reachability (a step's transitive prerequisites); a cycle is a step
	// that is its own prerequisite.
	before := map[string]map[string]bool{}
	var visit func(id string, stack map[string]bool) map[string]bool
	visit = func(id string, stack map[string]bool) map[string]bool {
		if r, ok := before[id]; ok {
			return r
		}
		if stack[id] {
			t.Fatalf("cycle through step %s", id)
		}
		stack[id] = true
		r := map[string]bool{}
		for _, d := range deps[id] {
			r[d] = true
			for x := range visit(d, stack) {
				r[x] = true
			}
		}
		delete(stack, id)
		before[id] = r
		return r
	}
	for _, id := range order {
		visit(id, map[string]bool{})
	}

	test, ok := steps["test"]
	if !ok {
		t.Fatal("no step with id test")
	}
	if test.Entrypoint != "make" || strings.Join(test.Args, " ") != "test" {
		t.Errorf("test step runs %s %v, want make test", test.Entrypoint, test.Args)
	}
	// make test needs Java and the emulators, PostgreSQL and Chromium: the
	// test step runs in the image built from infra/docker/test.Dockerfile
	// (a plain Go image has none of them).
	image, ok := steps["test-image"]
	if !ok {
		t.Fatal("no test-image step building the test environment")
	}
	build := strings.Join(image.Args, " ")
	if !strings.Contains(build, "-f infra/docker/test.Dockerfile") || !strings.Contains(build, "${_REPOSITORY}/relaybus-test:${COMMIT_SHA}") {
		t.Errorf("test-image does not build infra/docker/test.Dockerfile as relaybus-test:${COMMIT_SHA}: %s", build)
	}
	if test.Name != "${_REPOSITORY}/relaybus-test:${COMMIT_SHA}" || !before["test"]["test-image"] {
		t.Errorf("test step runs in %s; want the test-image step's image", test.Name)
	}
	for _, e := range test.Env {
		if strings.HasPrefix(e, "RELAYBUS_TEST_DATABASE_URL=") {
			t.Errorf("test step names a Postgres (%s); testenv starts its own, sized for the suite", e)
		}
	}
	deploy, ok := steps["deploy"]
	if !ok {
		t.Fatal("no step with id deploy")
	}
	for _, f := range functionNames(t) {
		build, push := "build-"+f, "push-"+f
		b, ok := steps[build]
		if !ok {
			t.Errorf("no %s step", build)
			continue
		}
		args := strings.Join(b.Args, " ")
		if !strings.Contains(args, "build -f infra/docker/Dockerfile --build-arg FUNCTION="+f+" ") || !strings.Contains(args, "/"+f+":${COMMIT_SHA}") || !strings.Contains(args, "/"+f+":${SHORT_SHA}") {
			t.Errorf("%s: %s", build, args)
		}
		if !before[build]["test"] {
			t.Errorf("%s does not wait for the tests", build)
		}
		for _, g := range functionNames(t) {
			if g != f && before[build]["build-"+g] {
				t.Errorf("%s waits for build-%s: the builds must run in parallel", build, g)
			}
		}
		if !before[push][build] {
			t.Errorf("%s does not wait for %s", push, build)
		}
		if !before["deploy"][push] {
			t.Errorf("deploy does not wait for %s", push)
		}
	}
	builds := 0
	for _, id := range order {
		if strings.HasPrefix(id, "build-") {
			builds++
		}
	}
	if builds != len(functionNames(t)) {
		t.Errorf("%d build steps for %d functions", builds, len(functionNames(t)))
	}
	script := strings.Join(deploy.Args, " ")
	for _, want := range []string{"apply", "-var=\"image_tag=${COMMIT_SHA}\"", "-var=\"image_repository=${_REPOSITORY}\""} {
		if !strings.Contains(script, want) {
			t.Errorf("deploy does not run %s", want)
		}
	}
	if deploy.Dir != "infra/terraform" {
		t.Errorf("deploy runs in %q", deploy.Dir)
	}
	// Every user substitution is declared (a typo would deploy an empty value).
	for _, m := range regexp.MustCompile(`\$\{(_[A-Z0-9_]+)\}`).FindAllStringSubmatch(string(raw), -1) {
		if _, ok := cb.Substitutions[m[1]]; !ok {
			t.Errorf("substitution %s is used but not declared", m[1])
		}
	}
	// Shell variables must be written $$name (Cloud Build substitutes $NAME).
	for _, s := range cb.Steps {
		for _, a := range s.Args {
			for _, m := range regexp.MustCompile(`(^|[^$])\$([a-z][a-z0-9_]*|\{[a-z][^}]*\}|\()`).FindAllString(a, -1) {
				t.Errorf("step %s: %q is a Cloud Build substitution; write $$ for the shell", s.ID, m)
			}
		}
	}
}

// TestTestImage: the test environment has what `make test` needs: Go 1.26,
// Java 17 with the gcloud Pub/Sub and Firestore emulators (a pinned Cloud
// SDK), PostgreSQL 15's binaries and Chromium.
func TestTestImage(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "infra", "docker", "test.Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	d := string(raw)
	for _, want := range []string{
		"ARG GO_VERSION=1.26", "FROM golang:${GO_VERSION} AS go", "COPY --from=go /usr/local/go /usr/local/go",
		"FROM debian:bookworm", "openjdk-17-jre-headless", "postgresql-15", "chromium",
		"google-cloud-cli-pubsub-emulator=${CLOUD_SDK_VERSION}", "google-cloud-cli-firestore-emulator=${CLOUD_SDK_VERSION}",
		"ARG CLOUD_SDK_VERSION=", " make", " git",
	} {
		if !strings.Contains(d, want) {
			t.Errorf("test.Dockerfile lacks %q", want)
		}
	}
	// The Go version of the image is the module's.
	mod, err := os.ReadFile(filepath.Join(repoRoot(t), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(mod)); m == nil || !strings.Contains(d, "ARG GO_VERSION="+m[1]+"\n") {
		t.Errorf("test.Dockerfile's Go is not go.mod's (%v)", m)
	}
}

// TestDockerfile: one multi-stage Dockerfile, the function as a build
// argument, a static build of ./functions/$FUNCTION/cmd, distroless
// nonroot, the topology baked in where RELAYBUS_TOPOLOGY points; and no
// Dockerfile at the root, where `gcloud run deploy --source .` would build
// it instead of the Go buildpack.
func TestDockerfile(t *testing.T) {
	if _, err := os.Stat(filepath.Join(repoRoot(t), "Dockerfile")); err == nil {
		t.Error("a Dockerfile at the repository root hijacks `gcloud run deploy --source .` (it is built instead of the buildpack); keep it in infra/docker")
	}
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "infra", "docker", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	d := string(raw)
	for _, want := range []string{
		"ARG FUNCTION",
		"CGO_ENABLED=0",
		"./functions/${FUNCTION}/cmd",
		"FROM gcr.io/distroless/static-debian12:nonroot",
		"COPY infra/topology.yaml /etc/relaybus/topology.yaml",
		"RELAYBUS_TOPOLOGY=/etc/relaybus/topology.yaml",
		"USER nonroot:nonroot",
	} {
		if !strings.Contains(d, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	if n := strings.Count(d, "\nFROM "); n != 2 {
		t.Errorf("Dockerfile has %d stages, want build + runtime", n)
	}
	ignore, err := os.ReadFile(filepath.Join(repoRoot(t), ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	excluded := map[string]bool{}
	for _, line := range strings.Split(string(ignore), "\n") {
		if line == "infra/topology.yaml" || line == "infra" || line == "functions" || line == "shared" {
			t.Errorf(".dockerignore excludes %s, which the image needs", line)
		}
		excluded[strings.TrimSuffix(strings.TrimSpace(line), "/")] = true
	}
	// Build caches and local state never go into the build context.
	for _, cache := range []string{".bin", "bin", ".state", ".git", "**/.terraform"} {
		if !excluded[cache] {
			t.Errorf(".dockerignore does not exclude %s", cache)
		}
	}
}

// TestBuildAccountRoles: cloudbuild.yaml's header and the README's deploy
// path list the same roles for the build's service account, and the
// README's setup commands grant exactly those.
func TestBuildAccountRoles(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(repoRoot(t), name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	header := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#\s+(roles/[a-zA-Z.]+)\s`).FindAllStringSubmatch(read("cloudbuild.yaml"), -1) {
		header[m[1]] = true
	}
	readme := read("README.md")
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^- `(roles/[a-zA-Z.]+)`").FindAllStringSubmatch(readme, -1) {
		listed[m[1]] = true
	}
	if len(header) < 10 || !reflect.DeepEqual(header, listed) {
		t.Errorf("build account roles differ:\ncloudbuild.yaml %v\nREADME.md       %v", sortedKeys(header), sortedKeys(listed))
	}
	granted := map[string]bool{}
	if m := regexp.MustCompile(`for r in ([^;]+); do`).FindStringSubmatch(readme); m != nil {
		for _, r := range strings.Fields(strings.ReplaceAll(m[1], "\\", " ")) {
			granted["roles/"+r] = true
		}
	}
	for _, m := range regexp.MustCompile(`--role=(roles/[a-zA-Z.]+)`).FindAllStringSubmatch(readme, -1) {
		granted[m[1]] = true
	}
	if !reflect.DeepEqual(granted, listed) {
		t.Errorf("the README's commands grant %v, its list says %v", sortedKeys(granted), sortedKeys(listed))
	}
	for _, want := range []string{
		"gcloud services enable cloudresourcemanager.googleapis.com serviceusage.googleapis.com",
		"go run ./functions/rollup/cmd sync-consumers",
		`relaybus -url "$DLQREPLAY" -gcloud-auth events ls`,
	} {
		if !strings.Contains(readme, want) {
			t.Errorf("README.md's deploy path lacks %q", want)
		}
	}
}
