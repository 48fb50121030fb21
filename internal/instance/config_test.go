package instance

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/firestore"
	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/reexec"
	"github.com/relaybus/relaybus/internal/telemetry"
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
			Telemetry: telemetry.Config{Export: "auto"}},
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

func TestRecorderRefusesAnUnknownMode(t *testing.T) {
	_, err := Recorder{Recording: Recording{Mode: "bigtable"}}.Open(context.Background(), "p", ledger.Options{})
	if err == nil || !strings.Contains(err.Error(), `LEDGER="bigtable": want firestore or off`) {
		t.Fatalf("err = %v", err)
	}
	if s, err := (Recorder{Recording: Recording{Mode: ledger.ModeOff}}).Open(context.Background(), "p", ledger.Options{}); s != nil || err != nil {
		t.Fatalf("LEDGER=off: %v, %v; want no store and no error", s, err)
	}
}

// The emulator's host is a configuration value: whether the variable the
// client library reads is cleared or names another emulator (the local
// stack runs its own beside the one make test starts), the ledger reaches
// the emulator it was given, and what it writes reads back there.
func TestLedgerOpensTheConfiguredEmulator(t *testing.T) {
	host := emutest.Host(t, emulator.Firestore)
	for _, env := range []string{"", "127.0.0.1:1"} {
		t.Run("FIRESTORE_EMULATOR_HOST="+env, func(t *testing.T) {
			project := emutest.UniqueProject(t)
			t.Setenv("FIRESTORE_EMULATOR_HOST", env)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			l := Defaults[Ledger]()
			l.EmulatorHost = host
			s, err := l.Open(ctx, project, ledger.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, err := s.Client().Collection("config_test").Doc("d").Set(ctx, map[string]any{"v": 1}); err != nil {
				t.Fatalf("write through the configured emulator: %v", err)
			}
			// Read it back with a client of the emulator's own, so the
			// document is known to be there, not in another emulator.
			t.Setenv("FIRESTORE_EMULATOR_HOST", host)
			c, err := firestore.NewClient(ctx, project)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			doc, err := c.Collection("config_test").Doc("d").Get(ctx)
			if err != nil || doc.Data()["v"] != int64(1) {
				t.Fatalf("read back from %s: %v %v", host, doc, err)
			}
		})
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

func TestOpenBrokerNamesTheVariableOfABadTransport(t *testing.T) {
	for _, tc := range []struct {
		p    PubSub
		want string
	}{
		{PubSub{Transport: "kafka"}, `config: TRANSPORT="kafka": want pubsub or nats`},
		{PubSub{Transport: "nats"}, "config: NATS_URL is required with TRANSPORT=nats"},
	} {
		b, err := tc.p.OpenBroker(context.Background(), "p")
		if err == nil || b != nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("OpenBroker(%+v) = %v, %v; want no broker and an error starting %q", tc.p, b, err, tc.want)
		}
	}
}
