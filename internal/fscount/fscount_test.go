package fscount_test

import (
	"context"
	"strings"
	"testing"

	"cloud.google.com/go/firestore"

	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/fscount"
)

// The counter sees what the RPCs carry: creates and updates as writes,
// gets and query results as reads, an empty query as one read.
func TestCountsWhatTheRPCsCarry(t *testing.T) {
	ctx := context.Background()
	var c fscount.Counter
	client, err := firestore.NewClient(ctx, emutest.FirestoreProject(t), c.Options()...)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	col := client.Collection("things")
	for _, id := range []string{"a", "b", "c"} {
		if _, err := col.Doc(id).Create(ctx, map[string]any{"n": 1}); err != nil {
			t.Fatal(err)
		}
	}
	bw := client.BulkWriter(ctx)
	for _, id := range []string{"d", "e"} {
		if _, err := bw.Create(col.Doc(id), map[string]any{"n": 2}); err != nil {
			t.Fatal(err)
		}
	}
	bw.End()
	if got := c.Writes(); got != 5 {
		t.Errorf("writes %d, want 5", got)
	}
	if _, err := col.Doc("a").Get(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := client.GetAll(ctx, []*firestore.DocumentRef{col.Doc("b"), col.Doc("missing")}); err != nil {
		t.Fatal(err)
	}
	if docs, err := col.Documents(ctx).GetAll(); err != nil || len(docs) != 5 {
		t.Fatalf("query: %d %v", len(docs), err)
	}
	if _, err := col.Where("n", "==", 9).Documents(ctx).GetAll(); err != nil {
		t.Fatal(err)
	}
	if got := c.Reads(); got != 1+2+5+1 {
		t.Errorf("reads %d, want 9 (a get, a batch get of two, a query of five, an empty query)", got)
	}
	if n, _ := c.MaxDocWritesPerSecond(); n != 1 {
		t.Errorf("most writes to one document in a second: %d, want 1", n)
	}
	c.ResetDocs()
	for range 3 {
		if _, err := col.Doc("z").Set(ctx, map[string]any{"n": firestore.Increment(1)}, firestore.MergeAll); err != nil {
			t.Fatal(err)
		}
	}
	if n, doc := c.MaxDocWritesPerSecond(); n != 3 || !strings.HasSuffix(doc, "/things/z") {
		t.Errorf("most writes to one document in a second: %d (%s), want 3 to things/z", n, doc)
	}
}
