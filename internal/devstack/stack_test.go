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
	"github.com/relaybus/relaybus/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The stack as make dev runs it (in-process Pub/Sub, the test's Postgres
// schema and the Firestore emulator), driven through the demo scenario to
// its exact expected end state.
func TestDemoScenarioOnTheLocalStack(t *testing.T) {
	ctx := context.Background()
	_, schema := pgtest.SchemaConfig(t, nil)
	s, err := Start(ctx, Options{
		Addr: "127.0.0.1:0", StateDir: t.TempDir(), Project: emutest.FirestoreProject(t),
		DatabaseURL: pgtest.SchemaURL(t, schema), FirestoreHost: emutest.Host(t, emulator.Firestore),
		RelayEvery: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		s.Close(cctx)
	}()
	var out bytes.Buffer
	err = Demo(ctx, s.Info, &out)
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
	_, err = Start(context.Background(), Options{Addr: s.Info.URL[len("http://"):], StateDir: t.TempDir()})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("is something else using the port")) {
		t.Fatalf("second stack on the same port: %v", err)
	}
}

// make dev without PostgreSQL binaries (and no DATABASE_URL) exits 1 with
// one line naming what to install.
func TestDevCommandNamesAMissingPrerequisite(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the dev command")
	}
	bin := filepath.Join(t.TempDir(), "dev")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/dev").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-state", t.TempDir())
	cmd.Env = append(os.Environ(), "DATABASE_URL=", "PG_BINDIR=/nonexistent")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1\n%s", err, out)
	}
	if !strings.Contains(string(out), "PostgreSQL server binaries not found: install them (apt-get install postgresql) or set DATABASE_URL") {
		t.Errorf("output does not say what to install:\n%s", out)
	}
}
