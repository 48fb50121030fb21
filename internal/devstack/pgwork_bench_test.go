package devstack

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/internal/benchcheck"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"
	"github.com/relaybus/relaybus/internal/pgcluster"
)

// pgCounters is a reading of a cluster's work: transactions committed in
// the stack's databases (pg_stat_database) and WAL written by the whole
// cluster (pg_current_wal_lsn, exact at the moment it is read).
type pgCounters struct {
	xacts int64
	lsn   string
	// walRecords and walFPI are pg_stat_wal's counts (the whole cluster):
	// WAL records, and full-page images among them (each a whole 8 KB page
	// written after a checkpoint's first change to it).
	walRecords, walFPI int64
}

// readPgCounters reads the counters through url (any database of the
// cluster), summing the transactions of the named databases only (not the
// benchmark's own connection to another). Backends report their
// transactions to pg_stat_database when they go idle, at most every
// second while busy and within 10 s once idle, so a reading is taken after
// the stack has been idle that long.
func readPgCounters(ctx context.Context, url string, dbs []string) (pgCounters, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return pgCounters{}, err
	}
	defer conn.Close(ctx)
	var c pgCounters
	err = conn.QueryRow(ctx, `SELECT (SELECT coalesce(sum(xact_commit), 0)::bigint FROM pg_stat_database WHERE datname = ANY($1)),
		pg_current_wal_lsn()::text, wal_records, wal_fpi FROM pg_stat_wal`, dbs).Scan(&c.xacts, &c.lsn, &c.walRecords, &c.walFPI)
	return c, err
}

// walBytes is the WAL written between two readings.
func walBytes(ctx context.Context, url string, from, to pgCounters) (int64, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int64
	err = conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, to.lsn, from.lsn).Scan(&n)
	return n, err
}

// resetStatements empties pg_stat_statements (the server loads it:
// testenv's cluster and the stack's own do), so a profile covers one window.
func resetStatements(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	return err
}

// printWALStats prints, as comment lines, pg_waldump's statistics by
// resource manager (heap, B-tree, transaction, ...) over the WAL between
// two readings: where the WAL of the window went, full-page images apart.
// It prints why when pg_waldump cannot read it (a missing binary, WAL
// recycled already).
func printWALStats(ctx context.Context, url string, from, to pgCounters) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		fmt.Printf("# wal by resource manager: %v\n", err)
		return
	}
	var dir string
	err = conn.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dir)
	conn.Close(ctx)
	if err != nil {
		fmt.Printf("# wal by resource manager: %v\n", err)
		return
	}
	bin, err := pgcluster.BinDir()
	if err != nil {
		fmt.Printf("# wal by resource manager: %v\n", err)
		return
	}
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "pg_waldump"), "--stats", "-p", filepath.Join(dir, "pg_wal"),
		"-s", from.lsn, "-e", to.lsn).CombinedOutput()
	if err != nil {
		fmt.Printf("# wal by resource manager: pg_waldump: %v: %s\n", err, strings.TrimSpace(string(out)))
		return
	}
	fmt.Printf("# wal by resource manager (pg_waldump --stats over the window, the whole cluster):\n")
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		fmt.Printf("#   %s\n", line)
	}
}

// statementRow is one statement's line of pg_stat_statements.
type statementRow struct {
	db          string
	calls, rows int64
	mean        float64
	query       string
}

// readStatements reads the statements the stack's databases executed
// since the reset, most called first.
func readStatements(ctx context.Context, url string, dbs []string) ([]statementRow, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT d.datname, s.calls, s.rows, s.mean_exec_time, s.query
		FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
		WHERE d.datname = ANY($1) AND s.query NOT LIKE '%pg_stat_statements%'
		ORDER BY s.calls DESC, s.total_exec_time DESC LIMIT 40`, dbs)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []statementRow
	for rows.Next() {
		var r statementRow
		if err := rows.Scan(&r.db, &r.calls, &r.rows, &r.mean, &r.query); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// printStatements prints, as comment lines, the statements read at the
// window's end, most called first: calls per purchase, rows per call, mean
// time, database, and the statement's first line (each of relaybus's .sql
// files opens with a comment naming it).
func printStatements(stmts []statementRow, purchases int) {
	fmt.Printf("# pg profile (pg_stat_statements over the window): calls/purchase  rows/call  mean ms  database  statement\n")
	for _, r := range stmts {
		fmt.Printf("#   %7.2f  %7.1f  %6.3f  %-16s %s\n", float64(r.calls)/float64(purchases), float64(r.rows)/float64(max(r.calls, 1)), r.mean, r.db, statementLabel(r.query))
	}
}

// statementLabel is a statement on one line, at most 110 characters.
func statementLabel(q string) string {
	q = strings.Join(strings.Fields(q), " ")
	if len(q) > 110 {
		q = q[:107] + "..."
	}
	return q
}

// statsSettle is how long backends may hold their transaction counts
// before reporting them (PostgreSQL's idle flush interval, plus a margin).
const statsSettle = 11 * time.Second

// BenchmarkPostgresWorkPerPurchase runs make dev's graph on a durable
// Postgres: one purchase is an order.purchased to member-service (push)
// and message-service (Eventarc), each emitting one child event that
// audit-service records: 3 events, 4 deliveries. After a warm-up it sends
// 50 purchases/s for 20 s, waits until every event is delivered and final
// in the ledger, and reports the transactions committed in the stack's
// databases and the WAL written, divided by the purchases; then the
// end-to-end latency at 50 and at 100 purchases/s (scheduled send → each
// consumer's commit), the second from a run of its own.
//
// The counting window runs from a reading taken when the stack was idle
// to one taken when it was idle again: the schedulers' and loops' polling
// in that window is counted too (it is work the database does), and the
// idle rate is printed beside the figure. The benchmark's observer reads
// no Postgres inside the window (it waits for the ledger's statuses), so
// none of its queries is counted.
func BenchmarkPostgresWorkPerPurchase(b *testing.B) {
	ctx := context.Background()
	for range b.N {
		s, ob := startBenchStack(b)
		var dbs []string
		for _, u := range s.Info.Databases {
			cfg, err := pgx.ParseConfig(u)
			if err != nil {
				b.Fatal(err)
			}
			dbs = append(dbs, cfg.Database)
		}
		slices.Sort(dbs)
		durable := requireDurableURL(b, s.Info.DatabaseURL)
		run := func(rate float64, d time.Duration) (*LoadRun, LoadReport) {
			lr := StartLoad(ctx, LoadOptions{URL: s.Info.URL, Rate: rate, Duration: d})
			<-lr.Done
			rep, err := ob.Check(ctx, lr, 3*time.Minute, nil)
			if err != nil {
				b.Fatal(err)
			}
			requireWhole(b, rep)
			return lr, rep
		}
		read := func() pgCounters {
			c, err := readPgCounters(ctx, s.Info.DatabaseURL, dbs)
			if err != nil {
				b.Fatal(err)
			}
			return c
		}

		run(50, 5*time.Second) // warm-up: connections, caches, the emulator's JIT
		time.Sleep(statsSettle)
		idle0 := read()
		time.Sleep(statsSettle)
		before := read()
		if err := resetStatements(ctx, s.Info.DatabaseURL); err != nil {
			b.Fatal(err)
		}
		idleXacts := float64(before.xacts-idle0.xacts) / statsSettle.Seconds()

		// The counted run: the observer reads no Postgres until the window
		// is closed (it waits on the ledger instead), so the count is the
		// stack's own work.
		const rate, seconds = 50, 20
		t0 := time.Now()
		lr := StartLoad(ctx, LoadOptions{URL: s.Info.URL, Rate: rate, Duration: seconds * time.Second})
		<-lr.Done
		if err := waitConsumed(ctx, ob, lr, 3*time.Minute); err != nil {
			b.Fatal(err)
		}
		time.Sleep(statsSettle)
		after := read()
		window := time.Since(t0)
		stmts, err := readStatements(ctx, s.Info.DatabaseURL, dbs)
		if err != nil {
			b.Fatal(err)
		}
		rep, err := ob.Check(ctx, lr, time.Minute, nil)
		if err != nil {
			b.Fatal(err)
		}
		requireWhole(b, rep)
		wal, err := walBytes(ctx, s.Info.DatabaseURL, before, after)
		if err != nil {
			b.Fatal(err)
		}
		purchases := rep.Accepted
		if purchases == 0 {
			b.Fatal("no purchase was accepted")
		}
		lat, missing, err := commitLatencies(ctx, ob, lr)
		if err != nil {
			b.Fatal(err)
		}
		fmt.Printf("# pg work: make dev's graph (1 purchase = 3 events, 4 deliveries), %d purchases/s for %d s after a 5 s warm-up, %d accepted, %d CONSUMED; Postgres %s; databases %v; counted from an idle reading to one %v later, after every event was final and %v idle; the idle stack commits %.1f transactions/s (polling), %.0f of the window's\n",
			rate, seconds, purchases, rep.Consumed, durable, dbs, window.Round(time.Second), statsSettle, idleXacts, idleXacts*window.Seconds())
		benchcheck.Figure(b, "pg_xacts_per_purchase", float64(after.xacts-before.xacts)/float64(purchases), "transactions")
		benchcheck.Figure(b, "pg_wal_kb_per_purchase", float64(wal)/1024/float64(purchases), "KB")
		fmt.Printf("# without the idle stack's polling over the window (%.1f/s × %v): %.2f transactions per purchase (the events' own work; a window a slow machine stretches counts more polling)\n",
			idleXacts, window.Round(time.Second), (float64(after.xacts-before.xacts)-idleXacts*window.Seconds())/float64(purchases))
		fmt.Printf("# wal: %.1f records and %.2f full-page images per purchase (pg_stat_wal, the whole cluster)\n",
			float64(after.walRecords-before.walRecords)/float64(purchases), float64(after.walFPI-before.walFPI)/float64(purchases))
		printWALStats(ctx, s.Info.DatabaseURL, before, after)
		printWALByRelation(ctx, s.Info.DatabaseURL, slices.Sorted(maps.Values(s.Info.Databases)), before, after, purchases)
		printStatements(stmts, purchases)
		printE2E(b, 50, lat, missing)

		lr, _ = run(100, seconds*time.Second)
		lat, missing, err = commitLatencies(ctx, ob, lr)
		if err != nil {
			b.Fatal(err)
		}
		printE2E(b, 100, lat, missing)
		ob.Close()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		s.Close(cctx)
		cancel()
	}
}

// waitConsumed waits until the ledger says every accepted event of lr is
// CONSUMED, reading only the ledger (Firestore), never the stack's
// Postgres, whose transactions are being counted. A timeout is not an
// error here: the observer's Check that follows reports what is missing.
func waitConsumed(ctx context.Context, ob *Observer, lr *LoadRun, timeout time.Duration) error {
	ids := acceptedIDs(lr)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		evs, err := query.New(ob.Ledger.Client()).Events(ctx, ids)
		if err != nil {
			return err
		}
		final := 0
		for _, id := range ids {
			if e, ok := evs[id]; ok && e.Status == model.StatusConsumed {
				final++
			}
		}
		if final == len(ids) {
			return nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return nil
}

// printE2E prints the e2e figures at rate: scheduled send → each consumer's
// commit. A delivery missing voids them.
func printE2E(b *testing.B, rate int, lat []time.Duration, missing int) {
	if missing > 0 || len(lat) == 0 {
		b.Fatalf("e2e at %d purchases/s: %d deliveries missing, %d arrived: the run prints no figure", rate, missing, len(lat))
	}
	p := percentiles(lat)
	fmt.Printf("# e2e at %d purchases/s for 20 s (open loop, make dev's graph, durable Postgres): scheduled send → each of the 2 consumers' commit (commit timestamp of its inbox row); all %d deliveries; max %.1f ms\n",
		rate, p.N, p.Max)
	if rate == 50 {
		benchcheck.Figure(b, "e2e_p50_ms_at_50", p.P50, "ms")
	}
	benchcheck.Figure(b, fmt.Sprintf("e2e_p99_ms_at_%d", rate), p.P99, "ms")
}

// requireWhole fails b when a load run left any accepted event lost,
// unpublished, undelivered or not final in the ledger.
func requireWhole(b *testing.B, rep LoadReport) {
	b.Helper()
	if rep.Stuck() {
		var out strings.Builder
		rep.Print(&out)
		b.Fatalf("the run left events behind: it prints no figure\n%s", out.String())
	}
}

// requireDurableURL fails the benchmark unless the server at url commits
// as production does, and returns its settings for the comment line.
func requireDurableURL(b *testing.B, url string) string {
	b.Helper()
	settings, ok, err := pgcluster.Durability(context.Background(), url)
	if err != nil {
		b.Fatal(err)
	}
	if !ok {
		b.Fatalf("the stack's Postgres is not durable (%s): its figures would not count", settings)
	}
	return settings
}

// walByRelation is the WAL of a window by relation and operation, the
// largest first: the whole record (full-page images included) counts for
// the relation of its first block reference.
type walByRelation struct {
	relation, op string
	n, bytes     int64
}

// printWALByRelation prints, as comment lines, the window's WAL per
// purchase by relation (table or index, named through the stack's
// databases dbURLs) and operation (pg_waldump's rmgr and the first word of
// its description: Heap/HOT_UPDATE, Btree/INSERT_LEAF, ...), the 80
// largest: which table's or index's writes the WAL goes to.
func printWALByRelation(ctx context.Context, url string, dbURLs []string, from, to pgCounters, purchases int) {
	names := map[string]string{} // "dboid/filenode" -> "db.relation"
	for _, u := range dbURLs {
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			fmt.Printf("# wal by relation: %v\n", err)
			return
		}
		rows, err := conn.Query(ctx, `SELECT (SELECT oid FROM pg_database WHERE datname = current_database())::text || '/' ||
			pg_relation_filenode(c.oid)::text, current_database() || '.' || c.relname
			FROM pg_class c WHERE pg_relation_filenode(c.oid) IS NOT NULL`)
		if err == nil {
			for rows.Next() {
				var k, v string
				if err = rows.Scan(&k, &v); err != nil {
					break
				}
				names[k] = v
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		conn.Close(ctx)
		if err != nil {
			fmt.Printf("# wal by relation: %v\n", err)
			return
		}
	}
	var dir string
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		fmt.Printf("# wal by relation: %v\n", err)
		return
	}
	err = conn.QueryRow(ctx, `SELECT current_setting('data_directory')`).Scan(&dir)
	conn.Close(ctx)
	if err != nil {
		fmt.Printf("# wal by relation: %v\n", err)
		return
	}
	bin, err := pgcluster.BinDir()
	if err != nil {
		fmt.Printf("# wal by relation: %v\n", err)
		return
	}
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "pg_waldump"), "-p", filepath.Join(dir, "pg_wal"),
		"-s", from.lsn, "-e", to.lsn).Output()
	if err != nil {
		fmt.Printf("# wal by relation: pg_waldump: %v\n", err)
		return
	}
	sums := map[[2]string]*walByRelation{}
	for _, line := range strings.Split(string(out), "\n") {
		rmgr, rest, ok := strings.Cut(strings.TrimPrefix(line, "rmgr: "), " ")
		if !ok || !strings.HasPrefix(line, "rmgr: ") {
			continue
		}
		var size int64
		if _, tot, ok := strings.Cut(rest, "len (rec/tot):"); ok {
			if _, t, ok := strings.Cut(tot, "/"); ok {
				t, _, _ = strings.Cut(t, ",")
				size, _ = strconv.ParseInt(strings.TrimSpace(t), 10, 64)
			}
		}
		op := rmgr
		if _, d, ok := strings.Cut(rest, "desc: "); ok {
			w, _, _ := strings.Cut(d, " ")
			op = rmgr + "/" + strings.TrimSuffix(w, ",")
		}
		rel := "(no relation)"
		if _, r, ok := strings.Cut(rest, "blkref #0: rel "); ok {
			r, _, _ = strings.Cut(r, " ")
			parts := strings.Split(r, "/")
			rel = r
			if len(parts) == 3 {
				if n, ok := names[parts[1]+"/"+parts[2]]; ok {
					rel = n
				}
			}
		}
		k := [2]string{rel, op}
		if sums[k] == nil {
			sums[k] = &walByRelation{relation: rel, op: op}
		}
		sums[k].n++
		sums[k].bytes += size
	}
	list := make([]*walByRelation, 0, len(sums))
	for _, s := range sums {
		list = append(list, s)
	}
	slices.SortFunc(list, func(a, b *walByRelation) int { return int(b.bytes - a.bytes) })
	fmt.Printf("# wal by relation and operation (pg_waldump over the window): records/purchase  bytes/purchase  relation  operation\n")
	for i, s := range list {
		if i == 80 {
			break
		}
		fmt.Printf("#   %6.2f  %7.0f  %-48s %s\n", float64(s.n)/float64(purchases), float64(s.bytes)/float64(purchases), s.relation, s.op)
	}
}
