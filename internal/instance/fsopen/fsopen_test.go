package fsopen

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/ledger"
)

// The modes LEDGER names are declared twice, in instance (so consume reads
// its configuration without the ledger's Firestore package) and in the
// ledger: they must agree.
func TestTheLedgerModesAreTheLedgers(t *testing.T) {
	if instance.LedgerFirestore != ledger.ModeFirestore || instance.LedgerOff != ledger.ModeOff {
		t.Errorf("instance's ledger modes %q, %q; the ledger's %q, %q",
			instance.LedgerFirestore, instance.LedgerOff, ledger.ModeFirestore, ledger.ModeOff)
	}
}

func TestRecorderRefusesAnUnknownMode(t *testing.T) {
	_, err := Recorder(context.Background(), instance.Recorder{Recording: instance.Recording{Mode: "bigtable"}}, "p", ledger.Options{})
	if err == nil || !strings.Contains(err.Error(), `LEDGER="bigtable": want firestore or off`) {
		t.Fatalf("err = %v", err)
	}
	if s, err := Recorder(context.Background(), instance.Recorder{Recording: instance.Recording{Mode: ledger.ModeOff}}, "p", ledger.Options{}); s != nil || err != nil {
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
			l := instance.Defaults[instance.Ledger]()
			l.EmulatorHost = host
			s, err := Ledger(ctx, l, project, ledger.Options{})
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

// A ledger or client that cannot be opened (here: no project) leaves no
// emulator connection behind: a host that retries its start-up would
// otherwise gather one connection, and its goroutines, per attempt.
func TestAFailedOpenClosesTheEmulatorConnection(t *testing.T) {
	l := instance.Defaults[instance.Ledger]()
	l.EmulatorHost = "127.0.0.1:1"
	before := runtime.NumGoroutine()
	for range 20 {
		if _, err := Ledger(context.Background(), l, "", ledger.Options{}); err == nil {
			t.Fatal("a ledger without a project opened")
		}
		if _, err := Client(context.Background(), l, "", "audit"); err == nil {
			t.Fatal("a client without a project opened")
		}
	}
	if !eventually.Within(10*time.Second, func() bool { return runtime.NumGoroutine() <= before+5 }) {
		t.Errorf("%d goroutines after 40 failed opens, %d before: their emulator connections were left open", runtime.NumGoroutine(), before)
	}
}
