package devstack

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/pgcluster"
	"github.com/relaybus/relaybus/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The stack as make dev runs it (in-process Pub/Sub, the test's Postgres
// schema and the Firestore emulator), driven through the demo scenario to
// its exact expected end state.
func TestDemoScenarioOnTheLocalStack(t *testing.T) {
	ctx := context.Background()
	s := startOnTestSchema(t, 500*time.Millisecond)
	defer closeStack(s)
	var out bytes.Buffer
	err := Demo(ctx, s.Info, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
}

func TestPortInUseIsAClearError(t *testing.T) {
	_, schema := pgtest.SchemaConfig(t, nil)
	s, err := Start(context.Background(), Options{Addr: "127.0.0.1:0", StateDir: t.TempDir(), Project: emutest.FirestoreProject(t),
		DatabaseURL: pgtest.SchemaURL(t, schema), FirestoreHost: emutest.Host(t, emulator.Firestore)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	_, err = Start(context.Background(), Options{Addr: s.Info.URL[len("http://"):], StateDir: t.TempDir(),
		DatabaseURL: s.Info.DatabaseURL, FirestoreHost: s.Info.FirestoreHost, PubSubHost: s.Info.PubSubHost})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("is something else using the port")) {
		t.Fatalf("second stack on the same port: %v", err)
	}
}

// make dev without PostgreSQL binaries and without Java (and nothing running
// instead) exits 1 with one line for each, naming what to install, before
// starting anything.
func TestDevCommandNamesEachMissingPrerequisite(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the dev command")
	}
	bin := filepath.Join(t.TempDir(), "dev")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/dev").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	state := t.TempDir()
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-state", state)
	cmd.Env = append(os.Environ(), "DATABASE_URL=", "FIRESTORE_EMULATOR_HOST=", "PG_BINDIR=/nonexistent", "PATH="+t.TempDir())
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := []string{
		"make dev: " + pgcluster.ErrNoBinaries.Error(),
		"make dev: " + emulator.ErrNoJava.Error() + "; or set FIRESTORE_EMULATOR_HOST to a running Firestore emulator",
	}
	if len(lines) != len(want) {
		t.Fatalf("output is %d lines, want one per missing prerequisite:\n%s", len(lines), out)
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d:\n got %s\nwant %s", i+1, lines[i], want[i])
		}
	}
	for _, w := range []string{"apt-get install postgresql", "apt-get install openjdk-17-jre-headless"} {
		if !strings.Contains(string(out), w) {
			t.Errorf("the output does not say %q", w)
		}
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Errorf("it started something before failing: %s holds %d entries", state, len(entries))
	}
}

// Check names nothing when every service is given.
func TestCheckWithEveryServiceRunning(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("PG_BINDIR", "/nonexistent")
	if err := Check(Options{DatabaseURL: "postgres://x", FirestoreHost: "127.0.0.1:1"}); err != nil {
		t.Errorf("Check with DATABASE_URL and FIRESTORE_EMULATOR_HOST set: %v", err)
	}
}

// startOnTestSchema starts the stack on the test's own Postgres schema and
// the shared Firestore emulator, its relay scheduled every relayEvery.
func startOnTestSchema(t *testing.T, relayEvery time.Duration) *Stack {
	t.Helper()
	_, schema := pgtest.SchemaConfig(t, nil)
	s, err := Start(context.Background(), Options{
		Addr: "127.0.0.1:0", StateDir: t.TempDir(), Project: emutest.FirestoreProject(t),
		DatabaseURL: pgtest.SchemaURL(t, schema), FirestoreHost: emutest.Host(t, emulator.Firestore),
		RelayEvery: relayEvery,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// closeStack closes s within 30 s.
func closeStack(s *Stack) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.Close(ctx)
}
