package relay_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/shared/outbox"
	"github.com/relaybus/relaybus/shared/relay"
)

// cutClaimDB holds the first claim until the test resumes it, then runs
// it to its commit and, when the caller's context has ended meanwhile,
// answers that context's error: a drain's deadline falling while its claim
// is on the wire, which the server committed anyway.
type cutClaimDB struct {
	*pgxpool.Pool
	once            sync.Once
	started, resume chan struct{}
}

func (d *cutClaimDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	first := false
	if strings.Contains(sql, "SET lease_owner = $2, epoch = d.epoch + 1") {
		d.once.Do(func() { first = true })
	}
	if !first {
		return d.Pool.Query(ctx, sql, args...)
	}
	close(d.started)
	<-d.resume
	rows, err := d.Pool.Query(context.WithoutCancel(ctx), sql, args...)
	if err == nil && ctx.Err() != nil {
		rows.Close() // reads the statement to its end: the leases are committed
		return nil, ctx.Err()
	}
	return rows, err
}

// A drain whose context ends while its claim is under way leaves no lease
// behind: the claim finishes and its runs are released, so the next drain
// publishes them at once instead of after RELAY_LEASE.
func TestADrainCutShortDuringItsClaimLeavesNoLease(t *testing.T) {
	e := newEnv(t)
	if _, err := outbox.Enqueue(context.Background(), e.pool, ev("cut", 1)); err != nil {
		t.Fatal(err)
	}
	db := &cutClaimDB{Pool: e.pool, started: make(chan struct{}), resume: make(chan struct{})}
	r, err := relay.New(relay.Options{DB: db, Publisher: e.fake.Client, Topology: e.top})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = r.Drain(ctx, time.Minute)
	}()
	<-db.started
	cancel()
	close(db.resume)
	<-done
	var leased int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM relaybus_outbox_dispatch WHERE lease_expires_at > now()`).Scan(&leased); err != nil {
		t.Fatal(err)
	}
	if leased != 0 {
		t.Fatalf("%d aggregate(s) left leased by the drain that was cut short", leased)
	}
	if _, err := r.Drain(context.Background(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(e.rec.versions("cut")); got != "[1]" {
		t.Fatalf("the next drain published %s, want [1]", got)
	}
}
