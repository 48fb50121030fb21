package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const checkTopology = `rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: member.points.events
    schemas:
      - {version: v1, type: protobuf, file: schemas/points.proto, message: shop.v1.PointsAdded}
    consumers: [{service: audit-service}]
`

const pointsV1 = `syntax = "proto3";
package shop.v1;
message PointsAdded { string member_id = 1; int64 points = 2; }
`

// repo is a git repository with the topology under infra/.
type repo struct {
	t   *testing.T
	dir string
}

func newRepo(t *testing.T) *repo {
	t.Helper()
	r := &repo{t: t, dir: t.TempDir()}
	r.git("init", "-q")
	r.write("infra/topology.yaml", checkTopology)
	r.write("infra/schemas/points.proto", pointsV1)
	r.commit("v1")
	return r
}

func (r *repo) git(args ...string) {
	r.t.Helper()
	cmd := exec.Command("git", append([]string{"-C", r.dir, "-c", "user.email=t@example.com", "-c", "user.name=t"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		r.t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

func (r *repo) write(name, body string) {
	r.t.Helper()
	p := filepath.Join(r.dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

func (r *repo) commit(msg string) {
	r.t.Helper()
	r.git("add", "-A")
	r.git("commit", "-q", "-m", msg)
}

func (r *repo) check(args ...string) (int, string, string) {
	return runCLI(append([]string{"schemas", "check", "--topology", filepath.Join(r.dir, "infra", "topology.yaml")}, args...)...)
}

// TestSchemasCheck: a compatible commit passes, an incompatible one is
// refused naming the topic, version, field and change, against the
// previous commit and against a base directory.
func TestSchemasCheck(t *testing.T) {
	r := newRepo(t)
	base := t.TempDir()
	for name, body := range map[string]string{"topology.yaml": checkTopology, "schemas/points.proto": pointsV1} {
		p := filepath.Join(base, filepath.FromSlash(name))
		_ = os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	r.write("infra/schemas/points.proto", strings.Replace(pointsV1, "int64 points = 2;", "int64 points = 2; string channel = 3;", 1))
	r.commit("add an optional field")
	code, out, errOut := r.check()
	if code != 0 || !strings.Contains(out, "1 schema version(s) compared with git HEAD~1, no forbidden change") {
		t.Fatalf("compatible change: exit %d\n%s%s", code, out, errOut)
	}

	r.write("infra/schemas/points.proto", strings.Replace(pointsV1, "int64 points = 2;", "string points = 2;", 1))
	r.commit("retype points")
	code, out, errOut = r.check()
	if code != 1 || !strings.Contains(out, "member.points.events v1: PointsAdded.points: type changed: int64 became string") ||
		!strings.Contains(errOut, "forbidden change") {
		t.Fatalf("incompatible change: exit %d\n%s%s", code, out, errOut)
	}
	// Against the base directory the field added since is fine and the retype is not.
	code, out, _ = r.check("--base", base)
	if code != 1 || !strings.Contains(out, "PointsAdded.points: type changed") || strings.Contains(out, "channel") {
		t.Fatalf("--base: exit %d\n%s", code, out)
	}

	// A new version may change anything: it is published beside v1.
	r.write("infra/schemas/points.proto", pointsV1)
	r.write("infra/schemas/points-v2.proto", `syntax = "proto3"; package shop.v1; message PointsAdded { string member = 1; }`)
	r.write("infra/topology.yaml", strings.Replace(checkTopology, "    consumers:",
		"      - {version: v2, type: protobuf, file: schemas/points-v2.proto, message: shop.v1.PointsAdded}\n    consumers:", 1))
	r.commit("v2 beside v1")
	code, out, errOut = r.check()
	if code != 1 || !strings.Contains(out, "v1: PointsAdded.points: type changed: string became int64") || strings.Contains(out, " v2:") {
		t.Fatalf("v1 retyped back is a change too, v2 is new: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = r.check("--git", "HEAD~3")
	if code != 0 {
		t.Fatalf("against the first commit v1 is unchanged and v2 is new: exit %d\n%s%s", code, out, errOut)
	}
}

// A check with nothing to compare with says so and fails, unless told
// there is nothing (--no-base, a first deploy), when it compiles the
// schemas and says it compared nothing. The deploy build's gate used to
// pass with exit 0 when the source had no .git.
func TestSchemasCheckWithoutABaseFailsUnlessToldToSkip(t *testing.T) {
	r := newRepo(t)
	code, out, errOut := r.check("--base", filepath.Join(t.TempDir(), "deployed"))
	if code != 1 || !strings.Contains(errOut, "there is nothing to compare the schemas with (on a first deploy pass --no-base)") {
		t.Errorf("a missing base: exit %d\n%s%s", code, out, errOut)
	}
	notGit := t.TempDir()
	if err := os.MkdirAll(filepath.Join(notGit, "schemas"), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(notGit, "topology.yaml"), []byte(checkTopology), 0o644)
	_ = os.WriteFile(filepath.Join(notGit, "schemas", "points.proto"), []byte(pointsV1), 0o644)
	code, out, errOut = runCLI("schemas", "check", "--topology", filepath.Join(notGit, "topology.yaml"))
	if code != 1 || !strings.Contains(errOut, "not in a git checkout? pass --base DIR") {
		t.Errorf("no .git: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCLI("schemas", "check", "--no-base", "--topology", filepath.Join(notGit, "topology.yaml"))
	if code != 0 || !strings.Contains(out, "no base (--no-base): 1 schema version(s) compile, compared with nothing") {
		t.Errorf("--no-base: exit %d\n%s%s", code, out, errOut)
	}
}
