// Package cost reads what a benchmark's run cost, from counters the
// operating system and Postgres keep rather than the code under test: a
// process's own CPU time (getrusage for this process, /proc for a child)
// and the statements a database executed (pg_stat_statements). Figures
// divided by the events of a run hold on a noisy machine, where latency
// and throughput do not.
package cost

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// CPU returns the user plus system CPU time this process has used so far
// (getrusage RUSAGE_SELF).
func CPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// ProcessCPU returns the user plus system CPU time process pid has used so
// far, from /proc/<pid>/stat (utime and stime, in clock ticks of 1/100 s
// on Linux), for a function run as a child process.
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields from the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	const tick = 10 * time.Millisecond // USER_HZ is 100 on Linux
	return time.Duration(ut+st) * tick, nil
}

// Statements reads the total number of statements the database at url has
// executed, transaction control included, from pg_stat_statements (its
// calls, summed over every statement of this database). The server must
// load the module (shared_preload_libraries, as testenv starts it); the
// extension is created in the database when missing. A run's statements
// are the difference of two readings; the readings' own statements (which
// name pg_stat_statements) are left out of both.
func Statements(ctx context.Context, url string) (int64, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, fmt.Errorf("pg_stat_statements: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return 0, fmt.Errorf("pg_stat_statements: %w (is it in shared_preload_libraries?)", err)
	}
	var calls int64
	err = conn.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND query NOT LIKE '%pg_stat_statements%'`).Scan(&calls)
	if err != nil {
		return 0, fmt.Errorf("pg_stat_statements: %w", err)
	}
	return calls, nil
}

// Snapshot is what pg_stat_statements holds for one database: the calls
// of each normalized statement (its text, whitespace collapsed), summed
// over users and nesting levels.
type Snapshot map[string]int64

// StatementSnapshot reads the calls of every statement the database at url
// has executed (pg_stat_statements, as Statements reads it), so that two
// snapshots show which statements a run sent (Snapshot.Since).
func StatementSnapshot(ctx context.Context, url string) (Snapshot, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("pg_stat_statements: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return nil, fmt.Errorf("pg_stat_statements: %w (is it in shared_preload_libraries?)", err)
	}
	rows, err := conn.Query(ctx, `SELECT query, calls FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND query NOT LIKE '%pg_stat_statements%'`)
	if err != nil {
		return nil, fmt.Errorf("pg_stat_statements: %w", err)
	}
	snap := Snapshot{}
	for rows.Next() {
		var (
			q     string
			calls int64
		)
		if err := rows.Scan(&q, &calls); err != nil {
			return nil, fmt.Errorf("pg_stat_statements: %w", err)
		}
		snap[strings.Join(strings.Fields(q), " ")] += calls
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pg_stat_statements: %w", err)
	}
	return snap, nil
}

// StatementCalls is one statement's calls in a run.
type StatementCalls struct {
	// Query is the normalized statement, whitespace collapsed.
	Query string
	// Calls is how many times it was executed.
	Calls int64
}

// Since returns the statements executed between before and s, most calls
// first (ties by text).
func (s Snapshot) Since(before Snapshot) []StatementCalls {
	var out []StatementCalls
	for q, n := range s {
		if d := n - before[q]; d > 0 {
			out = append(out, StatementCalls{Query: q, Calls: d})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Calls != out[j].Calls {
			return out[i].Calls > out[j].Calls
		}
		return out[i].Query < out[j].Query
	})
	return out
}

// PrintStatements writes the top statements of a run to w as benchmark
// comment lines, "# <what> per <unit>: <calls per unit> <statement>", each
// statement cut to 120 characters, divided by the run's units.
func PrintStatements(w io.Writer, what, unit string, cs []StatementCalls, units, top int) {
	for i, c := range cs {
		if i == top {
			fmt.Fprintf(w, "# %s per %s: %d more statements, %d calls\n", what, unit, len(cs)-top, Calls(cs[top:]))
			break
		}
		q := c.Query
		if len(q) > 120 {
			q = q[:117] + "..."
		}
		fmt.Fprintf(w, "# %s per %s: %.2f %s\n", what, unit, float64(c.Calls)/float64(units), q)
	}
}

// Calls is the statements' calls in all.
func Calls(cs []StatementCalls) int64 {
	var n int64
	for _, c := range cs {
		n += c.Calls
	}
	return n
}

// Transactions reads the transactions (committed and rolled back) of the
// database at url from pg_stat_database, through a connection to the
// cluster's postgres database (so the reading is not counted). A backend
// reports its counts when it goes idle, at most once a second, and at the
// latest when it exits: so Transactions first waits, within ctx, until no
// connection to the database is open. Close the pools of the code under
// test before a reading; a run's transactions are the difference of two
// readings of a database no one else uses.
func Transactions(ctx context.Context, url string) (int64, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return 0, fmt.Errorf("pg_stat_database: %w", err)
	}
	db := cfg.Database
	cfg.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, fmt.Errorf("pg_stat_database: %w", err)
	}
	defer conn.Close(ctx)
	for {
		var open int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, db).Scan(&open); err != nil {
			return 0, fmt.Errorf("pg_stat_activity: %w", err)
		}
		if open == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("pg_stat_database: %d connections to %s still open: %w", open, db, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	var n int64
	err = conn.QueryRow(ctx, `SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1`, db).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("pg_stat_database: %w", err)
	}
	return n, nil
}
