package infra

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
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

// cloudBuild is one Cloud Build configuration file.
type cloudBuild struct {
	raw           string
	Steps         []buildStep       `yaml:"steps"`
	Substitutions map[string]string `yaml:"substitutions"`
	Timeout       string            `yaml:"timeout"`
	Options       struct {
		Logging string `yaml:"logging"`
	} `yaml:"options"`
	LogsBucket string `yaml:"logsBucket"`
	steps      map[string]buildStep
	before     map[string]map[string]bool
}

// loadCloudBuild parses a configuration and computes each step's
// transitive prerequisites (no waitFor = every earlier step; "-" = none).
func loadCloudBuild(t *testing.T, name string) *cloudBuild {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), name))
	if err != nil {
		t.Fatal(err)
	}
	cb := &cloudBuild{raw: string(raw), steps: map[string]buildStep{}, before: map[string]map[string]bool{}}
	if err := yaml.Unmarshal(raw, cb); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var order []string
	for i, s := range cb.Steps {
		if s.ID == "" {
			t.Fatalf("%s: step %d has no id", name, i)
		}
		if _, dup := cb.steps[s.ID]; dup {
			t.Errorf("%s: step id %s twice", name, s.ID)
		}
		cb.steps[s.ID] = s
		order = append(order, s.ID)
	}
	deps := map[string][]string{}
	for i, id := range order {
		s := cb.steps[id]
		switch {
		case s.WaitFor == nil:
			deps[id] = append([]string(nil), order[:i]...)
		case len(s.WaitFor) == 1 && s.WaitFor[0] == "-":
		default:
			for _, w := range s.WaitFor {
				if _, ok := cb.steps[w]; !ok {
					t.Errorf("%s: step %s waits for unknown step %s", name, id, w)
				}
				deps[id] = append(deps[id], w)
			}
		}
	}
	var visit func(id string, stack map[string]bool) map[string]bool
	visit = func(id string, stack map[string]bool) map[string]bool {
		if r, ok := cb.before[id]; ok {
			return r
		}
		if stack[id] {
			t.Fatalf("%s: cycle through step %s", name, id)
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
		cb.before[id] = r
		return r
	}
	for _, id := range order {
		visit(id, map[string]bool{})
	}
	// Every user substitution is declared (a typo would use an empty value).
	for _, m := range regexp.MustCompile(`\$\{(_[A-Z0-9_]+)\}`).FindAllStringSubmatch(cb.raw, -1) {
		if _, ok := cb.Substitutions[m[1]]; !ok {
			t.Errorf("%s: substitution %s is used but not declared", name, m[1])
		}
	}
	// Shell variables must be written $$name (Cloud Build substitutes $NAME).
	for _, s := range cb.Steps {
		for _, a := range s.Args {
			for _, m := range regexp.MustCompile(`(^|[^$])\$([a-z][a-z0-9_]*|\{[a-z][^}]*\}|\()`).FindAllString(a, -1) {
				t.Errorf("%s: step %s: %q is a Cloud Build substitution; write $$ for the shell", name, s.ID, m)
			}
		}
	}
	return cb
}

func (cb *cloudBuild) step(t *testing.T, id string) buildStep {
	t.Helper()
	s, ok := cb.steps[id]
	if !ok {
		t.Fatalf("no step with id %s", id)
	}
	return s
}

// TestCloudBuildStepGraph: the CI build (cloudbuild.yaml) tests with
// CI=true (a tool the image lacks fails the suite instead of skipping),
// checks the schemas, builds each function's image in parallel after both
// and pushes it; it deploys nothing and runs no Terraform: the deploy is
// cloudbuild.deploy.yaml, as another account.
func TestCloudBuildStepGraph(t *testing.T) {
	cb := loadCloudBuild(t, "cloudbuild.yaml")
	test := cb.step(t, "test")
	if test.Entrypoint != "make" || strings.Join(test.Args, " ") != "test" {
		t.Errorf("test step runs %s %v, want make test", test.Entrypoint, test.Args)
	}
	if !contains(test.Env, "CI=true") {
		t.Errorf("the test step does not set CI=true (env %v): the PgBouncer pass and the Terraform CLI tests skip silently without it", test.Env)
	}
	image := cb.step(t, "test-image")
	build := strings.Join(image.Args, " ")
	if !strings.Contains(build, "-f infra/docker/test.Dockerfile") || !strings.Contains(build, "${_REPOSITORY}/relaybus-test:${COMMIT_SHA}") {
		t.Errorf("test-image does not build infra/docker/test.Dockerfile as relaybus-test:${COMMIT_SHA}: %s", build)
	}
	if strings.Contains(build, ":latest") {
		t.Errorf("test-image reads or writes a mutable :latest (any earlier build, of any branch, could have written it): %s", build)
	}
	if test.Name != "${_REPOSITORY}/relaybus-test:${COMMIT_SHA}" || !cb.before["test"]["test-image"] {
		t.Errorf("test step runs in %s; want the test-image step's image", test.Name)
	}
	for _, e := range test.Env {
		if strings.HasPrefix(e, "RELAYBUS_TEST_DATABASE_URL=") {
			t.Errorf("test step names a Postgres (%s); testenv starts its own, sized for the suite", e)
		}
	}
	for _, f := range functionNames(t) {
		build, push := "build-"+f, "push-"+f
		b := cb.step(t, build)
		args := strings.Join(b.Args, " ")
		if !strings.Contains(args, "build -f infra/docker/Dockerfile --build-arg FUNCTION="+f+" ") || !strings.Contains(args, "/"+f+":${COMMIT_SHA}") || !strings.Contains(args, "/"+f+":${SHORT_SHA}") {
			t.Errorf("%s: %s", build, args)
		}
		if !cb.before[build]["test"] || !cb.before[build]["schemas-check"] {
			t.Errorf("%s does not wait for the tests and the schema check", build)
		}
		for _, g := range functionNames(t) {
			if g != f && cb.before[build]["build-"+g] {
				t.Errorf("%s waits for build-%s: the builds must run in parallel", build, g)
			}
		}
		if !cb.before[push][build] {
			t.Errorf("%s does not wait for %s", push, build)
		}
	}
	if strings.Contains(cb.raw, "terraform") || cb.steps["deploy"].ID != "" {
		t.Error("the CI build runs Terraform: the deploy is cloudbuild.deploy.yaml's, as the deploy account")
	}
	// Logs to a bucket the account may write, so it needs no project role.
	if cb.Options.Logging != "GCS_ONLY" || cb.LogsBucket != "${_LOGS_BUCKET}" {
		t.Errorf("CI logging %q to %q: want GCS_ONLY to _LOGS_BUCKET (no project role for the CI account)", cb.Options.Logging, cb.LogsBucket)
	}
	// The schema check has no exit 0 for a missing base.
	sc := strings.Join(cb.step(t, "schemas-check").Args, " ")
	if !strings.Contains(sc, "exit 1") || !strings.Contains(sc, "--no-base") || strings.Contains(sc, "before submitting\" >&2\n          exit 0") {
		t.Errorf("schemas-check must fail without a base unless told to skip: %s", sc)
	}
}

// TestDeployBuild: cloudbuild.deploy.yaml deploys only the protected
// branch and only images CI pushed for its commit; it runs the preflight
// and the schema gate against what is deployed before terraform apply,
// interrupts the apply before the build's timeout (so Terraform saves its
// state and releases its lock instead of being killed mid-apply), and
// writes the deployed schemas' record after it.
func TestDeployBuild(t *testing.T) {
	cb := loadCloudBuild(t, "cloudbuild.deploy.yaml")
	guard := strings.Join(cb.step(t, "guard").Args, " ")
	for _, want := range []string{`"${BRANCH_NAME}" != "${_DEPLOY_BRANCH}"`, "gcloud artifacts docker images describe", ":${COMMIT_SHA}"} {
		if !strings.Contains(guard, want) {
			t.Errorf("guard lacks %q", want)
		}
	}
	deploy := cb.step(t, "deploy")
	if !cb.before["deploy"]["guard"] || deploy.Dir != "infra/terraform" {
		t.Errorf("deploy does not wait for the guard, or runs in %q", deploy.Dir)
	}
	script := strings.Join(deploy.Args, " ")
	order := []string{"relaybus deploy check", "relaybus schemas check --base /tmp/deployed", "terraform init", "terraform apply", "-var=\"image_repository=${_REPOSITORY}\"",
		"-var=\"image_tag=${COMMIT_SHA}\"", "-var=\"relaybus=/workspace/.bin/relaybus\"", `gcloud storage cp /tmp/deployed.tar.gz "$$record"`}
	at := 0
	for _, w := range order {
		i := strings.Index(script[at:], w)
		if i < 0 {
			t.Fatalf("deploy does not run %q after the steps before it", w)
		}
		at += i
	}
	if !strings.Contains(script, `no deployed schemas record`) || !strings.Contains(script, "relaybus schemas check --no-base") {
		t.Error("deploy must fail without a deployed record unless _SCHEMAS_BASE=none")
	}
	m := regexp.MustCompile(`timeout -s INT "\$\{_APPLY_MINUTES\}m" terraform apply`).FindString(script)
	if m == "" {
		t.Fatal("terraform apply is not interrupted before the build's timeout")
	}
	minutes, _ := strconv.Atoi(cb.Substitutions["_APPLY_MINUTES"])
	buildSecs, _ := strconv.Atoi(strings.TrimSuffix(cb.Timeout, "s"))
	if minutes < 60 || minutes*60+15*60 > buildSecs {
		t.Errorf("apply may run %d min in a build of %s: it needs an hour for a first apply and a quarter of an hour to stop cleanly", minutes, cb.Timeout)
	}
	if cb.Substitutions["_DEPLOY_BRANCH"] != "main" || cb.Substitutions["_SCHEMAS_BASE"] != "deployed" {
		t.Errorf("substitutions %v", cb.Substitutions)
	}
	if strings.Contains(cb.raw, "make test") || strings.Contains(cb.raw, "go test") {
		t.Error("the deploy build runs the tests: untrusted code would hold the deploy account")
	}
}

// imageRefs are the images a Dockerfile's FROM lines or a Cloud Build
// file's step names pull.
func imageRefs(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, f := range []string{"infra/docker/Dockerfile", "infra/docker/test.Dockerfile"} {
		raw, err := os.ReadFile(filepath.Join(repoRoot(t), f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`(?m)^FROM\s+(\S+)`).FindAllStringSubmatch(string(raw), -1) {
			out[f] = append(out[f], m[1])
		}
	}
	for _, f := range []string{"cloudbuild.yaml", "cloudbuild.deploy.yaml"} {
		for _, s := range loadCloudBuild(t, f).Steps {
			out[f] = append(out[f], s.Name)
		}
	}
	return out
}

// TestImagesArePinnedByDigest: every base and builder image is pinned by
// digest (name:tag@sha256:...), so a build runs the bytes that were
// reviewed, not whatever a tag points at today; the one exception is the
// test image the CI build itself built for its commit.
// infra/docker/pin-images.sh rewrites the digests.
func TestImagesArePinnedByDigest(t *testing.T) {
	pinned := regexp.MustCompile(`^[a-z0-9./-]+:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}$`)
	n := 0
	for file, refs := range imageRefs(t) {
		for _, r := range refs {
			n++
			if r == "${_REPOSITORY}/relaybus-test:${COMMIT_SHA}" {
				continue
			}
			if !pinned.MatchString(r) {
				t.Errorf("%s: %s is not pinned by digest (name:tag@sha256:<64 hex>)", file, r)
			}
		}
	}
	if n < 10 {
		t.Errorf("found %d image references", n)
	}
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "infra", "docker", "pin-images.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"infra/docker/Dockerfile", "infra/docker/test.Dockerfile", "cloudbuild.yaml", "cloudbuild.deploy.yaml"} {
		if !strings.Contains(string(raw), f) {
			t.Errorf("pin-images.sh does not rewrite %s", f)
		}
	}
}

// TestTestImage: the test environment has what `make test` needs: Go
// (go.mod's version), Java 17 with the gcloud Pub/Sub and Firestore
// emulators (a pinned Cloud SDK), PostgreSQL 15's binaries, PgBouncer (the
// pooler pass), Terraform (the CLI tests) and Chromium.
func TestTestImage(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "infra", "docker", "test.Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	d := string(raw)
	for _, want := range []string{
		"COPY --from=go /usr/local/go /usr/local/go", "COPY --from=terraform /bin/terraform /usr/local/bin/terraform",
		"FROM hashicorp/terraform:1.5.7@", "FROM debian:bookworm", "openjdk-17-jre-headless", "postgresql-15", "pgbouncer", "chromium",
		"google-cloud-cli-pubsub-emulator=${CLOUD_SDK_VERSION}", "google-cloud-cli-firestore-emulator=${CLOUD_SDK_VERSION}",
		"ARG CLOUD_SDK_VERSION=", " make", " git",
	} {
		if !strings.Contains(d, want) {
			t.Errorf("test.Dockerfile lacks %q", want)
		}
	}
	mod, err := os.ReadFile(filepath.Join(repoRoot(t), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(mod))
	for _, f := range []string{"test.Dockerfile", "Dockerfile"} {
		b, _ := os.ReadFile(filepath.Join(repoRoot(t), "infra", "docker", f))
		if m == nil || !strings.Contains(string(b), "FROM golang:"+m[1]+"@sha256:") {
			t.Errorf("%s's Go is not go.mod's (%v)", f, m)
		}
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
		if line == "infra/topology.yaml" || line == "infra" || line == "functions" || line == "shared" || line == "internal" {
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

// TestBuildAccountRoles: each build's header and docs/deploying.md list
// the same roles for its service account, and the guide's commands grant
// exactly those: the CI account none on the project (its three grants are
// on the repository and two buckets), the deploy account what Terraform
// needs.
func TestBuildAccountRoles(t *testing.T) {
	doc := read(t, "docs/deploying.md")
	for _, c := range []struct {
		file, heading, account string
		projectRoles           bool
	}{
		{"cloudbuild.yaml", "### The CI account", "$CI", false},
		{"cloudbuild.deploy.yaml", "### The deploy account", "$DEPLOY", true},
	} {
		header := map[string]bool{}
		for _, m := range regexp.MustCompile(`(?m)^#\s+(roles/[a-zA-Z.]+)\s`).FindAllStringSubmatch(read(t, c.file), -1) {
			header[m[1]] = true
		}
		section := docSection(t, "docs/deploying.md", c.heading)
		listed := map[string]bool{}
		for _, m := range regexp.MustCompile("(?m)^- `(roles/[a-zA-Z.]+)`").FindAllStringSubmatch(section, -1) {
			listed[m[1]] = true
		}
		if len(header) < 3 || !reflect.DeepEqual(header, listed) {
			t.Errorf("%s: roles differ:\n%s %v\ndocs/deploying.md %v", c.heading, c.file, sortedKeys(header), sortedKeys(listed))
		}
		granted := map[string]bool{}
		projectGrants := 0
		for _, cmd := range shellCommands(section) {
			if m := regexp.MustCompile(`^for r in ([^;]+); do`).FindStringSubmatch(cmd); m != nil {
				for _, r := range strings.Fields(m[1]) {
					granted["roles/"+r] = true
				}
			}
			if strings.Contains(cmd, "gcloud projects add-iam-policy-binding") {
				projectGrants++
				if !strings.Contains(cmd, "--member=serviceAccount:"+c.account+" ") {
					t.Errorf("%s: a project grant to another member: %s", c.heading, cmd)
				}
			}
			if m := regexp.MustCompile(`--role=(roles/[a-zA-Z.]+)`).FindStringSubmatch(cmd); m != nil {
				granted[m[1]] = true
			}
		}
		if !reflect.DeepEqual(granted, listed) {
			t.Errorf("%s: the guide's commands grant %v, its list says %v", c.heading, sortedKeys(granted), sortedKeys(listed))
		}
		if (projectGrants > 0) != c.projectRoles {
			t.Errorf("%s: %d project grant(s)", c.heading, projectGrants)
		}
	}
	for _, want := range []string{
		"gcloud services enable cloudresourcemanager.googleapis.com serviceusage.googleapis.com",
		`relaybus -url "$DLQREPLAY" -gcloud-auth events ls`,
		"terraform -chdir=infra/terraform init -backend-config=bucket=$PROJECT-tfstate -backend-config=prefix=relaybus",
		"relaybus deploy check --project $PROJECT",
		`relaybus -url "$DLQREPLAY" -gcloud-auth dlq replay <id>`,
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("docs/deploying.md lacks %q", want)
		}
	}
}

func read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
