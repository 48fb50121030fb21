package devstack

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/pgcluster"
	"github.com/relaybus/relaybus/internal/race"
	"github.com/relaybus/relaybus/shared/topology"
)

func TestPoolSharesFitTheBudget(t *testing.T) {
	for _, c := range []struct {
		budget, dbs, consumers int
		want                   map[poolRole]int // nil: an error
	}{
		// make dev's topology (2 databases, 4 consumers) at the default.
		{40, 2, 4, map[poolRole]int{roleAdmin: 2, roleOps: 1, roleRelay: 4, rolePublish: 10, roleConsumer: 4}},
		{100, 2, 4, map[poolRole]int{roleAdmin: 5, roleOps: 2, roleRelay: 10, rolePublish: 26, roleConsumer: 10}},
		{40, 1, 1, map[poolRole]int{roleAdmin: 4, roleOps: 2, roleRelay: 8, rolePublish: 18, roleConsumer: 8}},
		// The least that serves make dev's topology: the minimums.
		{18, 2, 4, map[poolRole]int{roleAdmin: 1, roleOps: 1, roleRelay: 2, rolePublish: 2, roleConsumer: 2}},
		{17, 2, 4, nil},
	} {
		got, err := poolShares(c.budget, c.dbs, c.consumers)
		name := fmt.Sprintf("budget %d, %d databases, %d consumers", c.budget, c.dbs, c.consumers)
		if c.want == nil {
			if err == nil || !strings.Contains(err.Error(), "PostgresBudget") || !strings.Contains(err.Error(), "at least 18") {
				t.Errorf("%s: err = %v, want one naming PostgresBudget and its minimum 18", name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		total := c.dbs*(got[roleAdmin]+got[roleOps]+got[roleRelay]) + got[rolePublish] + c.consumers*got[roleConsumer]
		if total != c.budget {
			t.Errorf("%s: the pools add up to %d, want the whole budget", name, total)
		}
		for r, n := range c.want {
			if got[r] != n {
				t.Errorf("%s: %v, want %v", name, got, c.want)
				break
			}
		}
	}
}

func TestWithPoolMaxConns(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u@h:5432/db?sslmode=disable":                    "postgres://u@h:5432/db?pool_max_conns=5&sslmode=disable",
		"postgres://u@h/db?pool_max_conns=16&search_path=s":         "postgres://u@h/db?pool_max_conns=5&search_path=s",
		"host=h user=u dbname=db pool_max_conns=16 sslmode=disable": "host=h user=u dbname=db sslmode=disable pool_max_conns=5",
	} {
		got, err := withPoolMaxConns(in, 5)
		if err != nil || got != want {
			t.Errorf("withPoolMaxConns(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// make dev's stack against a Postgres as a user runs it (PostgreSQL's
// default max_connections, 100; the stack connecting as an ordinary role)
// under load: the stack never holds more than its budget, Postgres refuses
// no connection, and every event reaches every consumer.
func TestStackKeepsToItsConnectionBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster of its own and 15 s of load")
	}
	if race.Enabled {
		t.Skip("times the stack's recovery under load, which the race detector slows several times: make test runs it again without -race")
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "relaybus-budget-")
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(dir, 0o755) // the cluster may run as the postgres user
	t.Cleanup(func() { os.RemoveAll(dir) })
	logPath := filepath.Join(dir, "postgres.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	pg, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: filepath.Join(dir, "data"), Log: logFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = pg.Stop(sctx)
	})
	admin, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	var maxConns string
	if err := admin.QueryRow(ctx, "SHOW max_connections").Scan(&maxConns); err != nil || maxConns != "100" {
		t.Fatalf("max_connections = %q (%v), want PostgreSQL's default 100", maxConns, err)
	}
	for _, q := range []string{"CREATE ROLE relaybus_app LOGIN CREATEDB", "CREATE DATABASE relaybus OWNER relaybus_app"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	admin.Close(ctx)
	url := fmt.Sprintf("postgres://relaybus_app@127.0.0.1:%d/relaybus?sslmode=disable", pg.Port)

	s, err := Start(ctx, Options{
		Addr: "127.0.0.1:0", StateDir: filepath.Join(dir, "state"), Project: emutest.UniqueProject(t),
		DatabaseURL: url, FirestoreHost: emutest.Host(t, emulator.Firestore), RelayEvery: time.Second,
		Logger: slog.New(publishErrors{slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})}),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		s.Close(cctx)
	}()
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	ob, err := Observe(ctx, s.Info, top)
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	conns := ob.SampleConnections(ctx, 100*time.Millisecond)
	// 50 requests/s: what this 2-core machine carries with room to spare
	// (see TestCrashRecovery); deliveries still run many at once.
	lr := StartLoad(ctx, LoadOptions{URL: s.Info.URL, Rate: 50, Duration: 15 * time.Second, Members: 20, Timeout: time.Minute})
	<-lr.Done
	rep, err := ob.Check(ctx, lr, 2*time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	peak, samples, failed := conns.Stop()
	t.Logf("%d requests, %d accepted, refused %v; peak %d connections over %d samples (%d failed)",
		rep.Scheduled, rep.Accepted, rep.Refused, peak, samples, failed)
	if peak > DefaultPostgresBudget {
		t.Errorf("the stack held %d connections at once; its budget is %d", peak, DefaultPostgresBudget)
	}
	if rep.Accepted != rep.Scheduled-rep.Skipped {
		t.Errorf("%d of %d requests sent were not accepted: %v", rep.Scheduled-rep.Skipped-rep.Accepted, rep.Scheduled-rep.Skipped, rep.Refused)
	}
	for _, c := range ob.Consumers {
		if rep.Delivered[c.Service] != rep.Written {
			t.Errorf("%s: %d of %d written events delivered (%v not delivered)", c.Service, rep.Delivered[c.Service], rep.Written, first(rep.NotDelivered[c.Service], 5))
		}
	}
	logged, _ := os.ReadFile(logPath)
	if refused := regexp.MustCompile(`(?m)^.*(too many clients|remaining connection slots).*$`).FindAll(logged, 5); len(refused) > 0 {
		t.Errorf("Postgres refused connections:\n%s", refused)
	}
}
