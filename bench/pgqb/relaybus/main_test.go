package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestAdapterSpeaksTheHarnessContract runs the adapter's binary as the
// harness does (its environment, ENQUEUE tokens on stdin, SIGTERM at the
// end) on a database of its own, and checks what the harness reads: the
// descriptor (its tables a superset of adapter.json's), every required
// metric with the record's fields, and every event the harness asked for
// handled exactly once.
func TestAdapterSpeaksTheHarnessContract(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the adapter with an embedded NATS server")
	}
	dbURL := pgtest.Database(t)
	bin := filepath.Join(t.TempDir(), "relaybus-bench")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "SCENARIO=long_horizon", "PRODUCER_MODE=fixed",
		"PRODUCER_RATE=200", "PRODUCER_PACING=harness", "PRODUCER_BATCH_MAX=128", "WORKER_COUNT=4",
		"JOB_WORK_MS=0", "SAMPLE_EVERY_S=1", "BENCH_INSTANCE_ID=0")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := make(chan []string, 1)
	go func() {
		var ls []string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			ls = append(ls, sc.Text())
		}
		lines <- ls
	}()

	// 30 small tokens and one past PRODUCER_BATCH_MAX, as the pacer sends
	// after a stall.
	want := 0
	for range 30 {
		fmt.Fprintln(stdin, "ENQUEUE 7")
		want += 7
	}
	fmt.Fprintln(stdin, "ENQUEUE 300")
	want += 300

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	handled := func() (rows, distinct, enqueued int) {
		_ = pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id) FROM relaybus_bench_handled`).Scan(&rows, &distinct)
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_outbox`).Scan(&enqueued)
		return rows, distinct, enqueued
	}
	eventually.True(t, time.Minute, fmt.Sprintf("%d events enqueued and handled", want), func() bool {
		rows, _, enq := handled()
		return enq >= want && rows >= want
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = stdin.Close()
	out := <-lines
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the adapter did not exit 0 after SIGTERM: %v", err)
	}

	rows, distinct, enq := handled()
	if enq != want || rows != want || distinct != want {
		t.Errorf("harness asked for %d events: %d enqueued, handled %d times (%d distinct); want each once", want, enq, rows, distinct)
	}
	var orphans int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM relaybus_outbox o
		WHERE NOT EXISTS (SELECT 1 FROM relaybus_bench_handled h WHERE h.event_id = o.id)`).Scan(&orphans); err != nil {
		t.Fatal(err)
	}
	if orphans != 0 {
		t.Errorf("%d enqueued events were never handled", orphans)
	}
	checkRecords(t, out, want)
}

// checkRecords checks the JSONL the harness tails: the descriptor first,
// then samples of every required metric.
func checkRecords(t *testing.T, lines []string, enqueued int) {
	t.Helper()
	if len(lines) == 0 {
		t.Fatal("no JSONL on stdout")
	}
	var desc struct {
		Kind          string   `json:"kind"`
		System        string   `json:"system"`
		Version       string   `json:"version"`
		SchemaVersion string   `json:"schema_version"`
		DBName        string   `json:"db_name"`
		StartedAt     string   `json:"started_at"`
		EventTables   []string `json:"event_tables"`
		Extensions    []string `json:"extensions"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &desc); err != nil {
		t.Fatalf("first line %q: %v", lines[0], err)
	}
	if desc.Kind != "descriptor" || desc.System != "relaybus" || desc.Version == "" || desc.SchemaVersion == "" ||
		desc.DBName == "" || desc.Extensions == nil {
		t.Errorf("descriptor %q: want kind descriptor, system relaybus, version, schema_version, db_name and extensions", lines[0])
	}
	if _, err := time.Parse(time.RFC3339, desc.StartedAt); err != nil {
		t.Errorf("descriptor started_at %q: %v", desc.StartedAt, err)
	}
	var manifest struct {
		System      string   `json:"system"`
		EventTables []string `json:"event_tables"`
	}
	b, err := os.ReadFile("adapter.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &manifest); err != nil {
		t.Fatalf("adapter.json: %v", err)
	}
	for _, tb := range manifest.EventTables {
		if !slices.Contains(desc.EventTables, tb) {
			t.Errorf("descriptor's event_tables %v lack adapter.json's %s (the harness fails the run on this drift)", desc.EventTables, tb)
		}
	}

	required := []string{"claim_p50_ms", "claim_p95_ms", "claim_p99_ms", "enqueue_rate", "completion_rate", "queue_depth"}
	seen := map[string]int{}
	var enqueuedSeen, maxP99 float64
	for _, l := range lines[1:] {
		var s struct {
			T           string   `json:"t"`
			System      string   `json:"system"`
			Kind        string   `json:"kind"`
			SubjectKind string   `json:"subject_kind"`
			Subject     *string  `json:"subject"`
			Metric      string   `json:"metric"`
			Value       *float64 `json:"value"`
			WindowS     *float64 `json:"window_s"`
		}
		if err := json.Unmarshal([]byte(l), &s); err != nil {
			t.Errorf("sample %q: %v", l, err)
			continue
		}
		if _, err := time.Parse(time.RFC3339, s.T); err != nil || s.System != "relaybus" || s.Kind != "adapter" ||
			s.SubjectKind != "adapter" || s.Subject == nil || *s.Subject != "" || s.Value == nil || s.WindowS == nil {
			t.Errorf("sample %q: want t, system relaybus, kind and subject_kind adapter, subject \"\", value and window_s", l)
			continue
		}
		seen[s.Metric]++
		switch s.Metric {
		case "enqueue_rate":
			enqueuedSeen += *s.Value // samples are 1 s apart, give or take the last one
		case "claim_p99_ms":
			maxP99 = max(maxP99, *s.Value)
		}
	}
	for _, m := range required {
		if seen[m] == 0 {
			t.Errorf("no %s sample in %d lines", m, len(lines))
		}
	}
	if enqueuedSeen == 0 || maxP99 <= 0 {
		t.Errorf("the samples saw no enqueues (rates summed to %.1f) or no claim latency (max p99 %.1f ms) for %d events", enqueuedSeen, maxP99, enqueued)
	}
}
