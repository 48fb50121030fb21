package instance

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/reexec"
)

// A function's configuration as the functions declare it: the shared
// pieces embedded once, the function's own settings beside them.
type testConfig struct {
	Env
	PubSub PubSub
	Ledger Recorder
	Own    string `env:"TEST_OWN, default=own"`
}

func TestLoadFillsEverySharedPieceFromTheEnvironment(t *testing.T) {
	t.Setenv("GOOGLE_CLOUD_PROJECT", "p-1")
	t.Setenv("FIRESTORE_DATABASE", "ledger-db")
	t.Setenv("LEDGER", "off")
	t.Setenv("LEDGER_BUDGET", "3s")
	t.Setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:1")
	t.Setenv("TRANSPORT", "nats")
	t.Setenv("NATS_URL", "nats://127.0.0.1:2")
	t.Setenv("SHUTDOWN_TIMEOUT", "5s")
	t.Setenv("FIRESTORE_EMULATOR_HOST", "")
	c, err := Load[testConfig](context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := testConfig{
		Env: Env{ProjectID: "p-1", LogLevel: "info", ShutdownTimeout: 5 * time.Second,
			Telemetry: otelsetup.Config{Export: "auto"}},
		PubSub: PubSub{EmulatorHost: "127.0.0.1:1", Transport: "nats", NATSURL: "nats://127.0.0.1:2"},
		Ledger: Recorder{Ledger: Ledger{Database: "ledger-db", Retention: 720 * time.Hour, ReconcileAfter: time.Minute},
			Recording: Recording{Mode: "off", Budget: 3 * time.Second}},
		Own: "own",
	}
	if c != want {
		t.Errorf("Load:\n got %+v\nwant %+v", c, want)
	}
}

func TestLoadNamesTheVariableOfABadValue(t *testing.T) {
	t.Setenv("LEDGER_BUDGET", "ten seconds")
	_, err := Load[testConfig](context.Background())
	if err == nil || !strings.HasPrefix(err.Error(), `config: LEDGER_BUDGET: time: invalid duration "ten seconds"`) {
		t.Fatalf("err = %v, want one naming LEDGER_BUDGET and the rule", err)
	}
}

// Defaults reads no environment, and the documented defaults are the
// engines' own.
func TestDefaultsAreTheDocumentedOnesWhateverTheEnvironment(t *testing.T) {
	t.Setenv("LEDGER", "off")
	t.Setenv("FIRESTORE_DATABASE", "elsewhere")
	c := Defaults[testConfig]()
	if c.Ledger.Mode != ledger.ModeFirestore || c.Ledger.Database != ledger.DefaultDatabase || c.Ledger.Budget != 10*time.Second ||
		c.Ledger.ReconcileAfter != ledger.DefaultReconcileAfter || c.ShutdownTimeout != DefaultShutdownTimeout || c.Own != "own" {
		t.Errorf("Defaults: %+v", c)
	}
	if c.Ledger.Retention != ledger.DefaultRetention {
		t.Errorf("LEDGER_RETENTION default %v, the ledger's %v", c.Ledger.Retention, ledger.DefaultRetention)
	}
}

func TestDatabaseURLsReadsTheOtherDatabasesVariables(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://main")
	t.Setenv("DATABASE_URL_MEMBER_DB", "postgres://member")
	t.Setenv("DATABASE_URL_AUDIT", "")
	got := DatabaseURLs([]string{"main", " member-db", "audit", "missing"})
	if len(got) != 1 || got["member-db"] != "postgres://member" {
		t.Errorf("DatabaseURLs = %v, want only member-db (main is DATABASE_URL's field; unset and empty ones left out)", got)
	}
}

// Main refuses a SHUTDOWN_TIMEOUT that is not a positive duration before
// it serves, naming the variable.
func TestMainRefusesABadShutdownTimeout(t *testing.T) {
	for _, v := range []string{"soon", "0s"} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), reexec.Env(childRole, ""), "PORT=0", "SHUTDOWN_TIMEOUT="+v, "FUNCTION_TARGET=")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "SHUTDOWN_TIMEOUT") {
			t.Errorf("SHUTDOWN_TIMEOUT=%s: %v, output %q; want exit 1 naming SHUTDOWN_TIMEOUT", v, err, out)
		}
	}
}
