package cost_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/internal/cost"
	"github.com/relaybus/relaybus/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Statements counts what the database executed: a transaction of two
// statements is four (BEGIN, two, COMMIT), and the readings themselves
// are not counted.
func TestStatementsCountsEachRoundTrip(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t) // its own: other packages' tests run statements in the shared one
	before, err := cost.Statements(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	snap0, err := cost.StatementSnapshot(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`SELECT 1`, `SELECT 2`} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := cost.Statements(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if got := after - before; got != 4 {
		t.Errorf("%d statements counted for BEGIN, SELECT 1, SELECT 2, COMMIT; want 4", got)
	}
	snap1, err := cost.StatementSnapshot(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	// pg_stat_statements normalizes the constants: both SELECTs are one
	// statement, called twice. Statements' own reading is left out.
	want := []cost.StatementCalls{{Query: "SELECT $1", Calls: 2}, {Query: "begin", Calls: 1}, {Query: "commit", Calls: 1}} // as pgx sends them
	if got := snap1.Since(snap0); !slices.Equal(got, want) {
		t.Errorf("statements of the run: %+v, want %+v", got, want)
	}
}

// CPU and ProcessCPU read the same clock for this process: 200 ms of CPU
// spent in a busy loop (as getrusage counts it) shows in /proc as well, to
// its 10 ms ticks.
func TestCPU(t *testing.T) {
	c0, err := cost.CPU()
	if err != nil {
		t.Fatal(err)
	}
	p0, err := cost.ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := cost.CPU()
		if err != nil {
			t.Fatal(err)
		}
		if c-c0 >= 200*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("getrusage counted %v of CPU in a minute of busy loop", c-c0)
		}
	}
	p1, err := cost.ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := p1 - p0; d < 170*time.Millisecond {
		t.Errorf("/proc/<pid>/stat counted %v of a 200 ms busy loop", d)
	}
}
