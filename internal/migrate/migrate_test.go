package migrate_test

import (
	"context"
	"os"
	"reflect"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/relaybus/relaybus/internal/migrate"
	"github.com/relaybus/relaybus/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestApplyIsIdempotentAndConcurrencySafe(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Schema(t)
	line, err := migrate.LoadFS("widgets", os.DirFS("testdata"), "line")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	results := make([][]int, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Add(1)
		go func() { defer wg.Done(); results[i], errs[i] = line.Apply(ctx, pool) }()
	}
	wg.Wait()
	total := 0
	for i := range results {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		total += len(results[i])
	}
	if total != 2 {
		t.Fatalf("4 concurrent Applies ran %d migrations in all, want each of the 2 once: %v", total, results)
	}
	again, err := line.Apply(ctx, pool)
	if err != nil || len(again) != 0 {
		t.Fatalf("second Apply ran %v, %v", again, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO widgets (id, name) VALUES (1, 'a')`); err != nil {
		t.Fatalf("migrated table unusable: %v", err)
	}
	var versions []int
	rows, _ := pool.Query(ctx, `SELECT version FROM relaybus_migrations WHERE line = 'widgets' ORDER BY version`)
	for rows.Next() {
		var v int
		_ = rows.Scan(&v)
		versions = append(versions, v)
	}
	if !reflect.DeepEqual(versions, []int{1, 2}) {
		t.Fatalf("recorded %v", versions)
	}
}

func TestLoadFSRefusesBadNames(t *testing.T) {
	for _, fsys := range []fstest.MapFS{
		{"m/create.sql": {Data: []byte("")}},
		{"m/001_a.sql": {Data: []byte("")}, "m/1_b.sql": {Data: []byte("")}},
		{"m/000_zero.sql": {Data: []byte("")}},
	} {
		if _, err := migrate.LoadFS("x", fsys, "m"); err == nil {
			t.Errorf("accepted %v", fsys)
		}
	}
}
