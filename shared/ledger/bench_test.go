package ledger

import (
	"context"
	"fmt"
	"testing"
	"time"

	"cloud.google.com/go/firestore"
)

// BenchmarkLedgerCost counts Firestore reads and writes per event in the
// happy path with 1, 2 and 5 consumers (counted by the store), and runs the
// seed's shape on the same emulator as a baseline.
func BenchmarkLedgerCost(b *testing.B) {
	const events = 50
	for i := 0; i < b.N; i++ {
		for _, n := range []int{1, 2, 5} {
			s := newStore(b, Options{})
			reads, writes := happyPath(b, s, n, events)
			seedReads, seedWrites := seedShape(b, s.Client(), n, events)
			fmt.Printf("BENCH ledger_writes_per_event_n%d %g writes\n", n, writes)
			fmt.Printf("BENCH ledger_reads_per_event_n%d %g reads\n", n, reads)
			fmt.Printf("ledger cost n%d: relaybus %g writes %g reads per event; seed shape %g writes %g reads per event; writes ratio %.2f\n",
				n, writes, reads, seedWrites, seedReads, writes/seedWrites)
		}
		fmt.Printf("ledger cost: happy path of %d events per consumer count (RecordSent batch, one successful attempt and one rollup per consumer), Firestore emulator, registry reads excluded (cached per topic)\n", events)
	}
}

// seedShape runs the seed's ledger writes (event-ledger-design.md §3.2,
// §2.6) for events with n consumers and counts them: events inserted
// PENDING, an attempt-0 row per consumer, an update to SENT, then per
// callback an attempt row and a rollup that reads the event's attempts and
// writes the status.
func seedShape(tb testing.TB, c *firestore.Client, n, events int) (reads, writes float64) {
	tb.Helper()
	ctx := context.Background()
	col, att := c.Collection("seed_events"), c.Collection("seed_consumptions")
	var r, w int
	for i := 0; i < events; i++ {
		id := fmt.Sprintf("seed-%d-%d", n, i)
		now := time.Now()
		if _, err := col.Doc(id).Create(ctx, map[string]any{"eventId": id, "status": "PENDING", "createdAt": now}); err != nil {
			tb.Fatal(err)
		}
		w++
		for c := 0; c < n; c++ {
			if _, err := att.NewDoc().Create(ctx, map[string]any{"eventId": id, "consumerId": fmt.Sprint(c), "attemptNo": 0, "success": nil}); err != nil {
				tb.Fatal(err)
			}
			w++
		}
		if _, err := col.Doc(id).Update(ctx, []firestore.Update{{Path: "status", Value: "SENT"}, {Path: "sentAt", Value: now}}); err != nil {
			tb.Fatal(err)
		}
		w++
		for c := 0; c < n; c++ {
			if _, err := att.NewDoc().Create(ctx, map[string]any{"eventId": id, "consumerId": fmt.Sprint(c), "attemptNo": 1, "success": true}); err != nil {
				tb.Fatal(err)
			}
			w++
			docs, err := att.Where("eventId", "==", id).Documents(ctx).GetAll()
			if err != nil {
				tb.Fatal(err)
			}
			r += max(len(docs), 1)
			if _, err := col.Doc(id).Update(ctx, []firestore.Update{{Path: "status", Value: "SENT?"}, {Path: "statusAt", Value: time.Now()}}); err != nil {
				tb.Fatal(err)
			}
			w++
		}
	}
	return float64(r) / float64(events), float64(w) / float64(events)
}
