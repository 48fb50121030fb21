// Command testenv runs a command (the test suite, the benchmarks) with the
// services relaybus's tests need: a throwaway PostgreSQL cluster, the
// Firestore emulator and the Pub/Sub emulator, each started once for the
// whole run unless the environment already names one, and stopped afterwards.
//
//	go run ./internal/cmd/testenv -- go test ./...
//	go run ./internal/cmd/testenv -durable -- go test -bench . ./...
//
// The cluster runs without fsync for the test suite's speed; -durable keeps
// fsync, synchronous_commit and full_page_writes on, as production does, for
// the benchmarks (and sets RELAYBUS_DURABLE=1 for them to say so).
//
// It sets RELAYBUS_TEST_DATABASE_URL, RELAYBUS_TEST_PGBOUNCER_URL (PgBouncer
// in transaction mode in front of that server; without the pgbouncer
// program the tests through it skip, except under CI=true, where its
// absence is an error), FIRESTORE_EMULATOR_HOST and PUBSUB_EMULATOR_HOST
// for the command. A missing prerequisite is reported in
// one line that says what to install.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/relaybus/relaybus/internal/emulator"
	"github.com/relaybus/relaybus/internal/pgbouncer"
	"github.com/relaybus/relaybus/internal/pgcluster"
	"github.com/relaybus/relaybus/internal/pgtest"
)

func main() {
	args := os.Args[1:]
	durable := false
	if len(args) > 0 && args[0] == "-durable" {
		durable, args = true, args[1:]
	}
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: testenv [-durable] -- command [args...]")
		os.Exit(2)
	}
	os.Exit(run(args, durable))
}

func run(args []string, durable bool) int {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	logf := func(format string, a ...any) { fmt.Fprintf(os.Stderr, "testenv: "+format+"\n", a...) }

	if u := os.Getenv(pgtest.EnvURL); u != "" && durable {
		// A server named by the environment is used as it is, so -durable
		// must check it rather than trust it: figures on a non-durable
		// server do not count (docs/benchmarks.md).
		settings, ok, err := pgcluster.Durability(ctx, u)
		if err != nil {
			logf("%s: %v", pgtest.EnvURL, err)
			return 1
		}
		if !ok {
			logf("-durable: %s is not durable (%s): unset it to start a durable cluster, or turn those settings on", pgtest.EnvURL, settings)
			return 1
		}
	}
	if os.Getenv(pgtest.EnvURL) == "" {
		dir, err := os.MkdirTemp("", "relaybus-testenv-")
		if err != nil {
			logf("%v", err)
			return 1
		}
		defer os.RemoveAll(dir)
		_ = os.Chmod(dir, 0o755)
		start := time.Now()
		logFile, _ := os.Create(filepath.Join(dir, "postgres.log"))
		c, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: filepath.Join(dir, "data"), Log: logFile, Durable: durable,
			Settings: map[string]string{"max_connections": "400", "shared_preload_libraries": "pg_stat_statements"}})
		if err != nil {
			logf("%v", err)
			return 1
		}
		defer func() {
			sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer scancel()
			_ = c.Stop(sctx)
		}()
		os.Setenv(pgtest.EnvURL, c.URL)
		if durable {
			os.Setenv("RELAYBUS_DURABLE", "1")
		}
		logf("PostgreSQL on port %d (durable %v, %v)", c.Port, durable, time.Since(start).Round(time.Millisecond))
	}
	if os.Getenv(pgbouncer.EnvURL) == "" {
		// PgBouncer in transaction mode in front of the server, for the
		// tests that run relaybus through a pooler (see pgtest.Pooled).
		dir, err := os.MkdirTemp("", "relaybus-pgbouncer-")
		if err != nil {
			logf("%v", err)
			return 1
		}
		defer os.RemoveAll(dir)
		_ = os.Chmod(dir, 0o755)
		start := time.Now()
		b, err := pgbouncer.Start(ctx, pgbouncer.Options{ServerURL: os.Getenv(pgtest.EnvURL), Dir: dir})
		switch {
		case errors.Is(err, pgbouncer.ErrNoBinary) && os.Getenv("CI") != "true":
			logf("%v; the tests through PgBouncer will be skipped", err)
		case err != nil:
			logf("%v", err)
			return 1
		default:
			defer func() {
				sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer scancel()
				_ = b.Stop(sctx)
			}()
			os.Setenv(pgbouncer.EnvURL, b.URL)
			logf("PgBouncer (transaction mode) on port %d (%v)", b.Port, time.Since(start).Round(time.Millisecond))
		}
	}
	for _, kind := range []emulator.Kind{emulator.Firestore, emulator.PubSub} {
		if os.Getenv(kind.EnvHost()) != "" {
			continue
		}
		start := time.Now()
		p, err := emulator.Start(ctx, kind, emulator.Options{})
		if err != nil {
			logf("%v", err)
			return 1
		}
		defer p.Stop()
		os.Setenv(kind.EnvHost(), p.Host)
		logf("%s emulator on %s (%v)", kind, p.Host, time.Since(start).Round(time.Millisecond))
	}

	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	default:
		logf("%v", err)
		return 1
	}
}
