package batch_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/relaybus/relaybus/internal/batch"
)

// The batcher's tests run in a synctest bubble: MaxWait and the
// contexts' deadlines pass on the bubble's clock, and synctest.Wait says
// when the workers have done what they can.

func TestBatchesRunInOrderAndFlushWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu    sync.Mutex
			got   []int
			sizes []int
		)
		b := batch.New(func(_ context.Context, items []int) {
			time.Sleep(time.Millisecond)
			mu.Lock()
			got = append(got, items...)
			sizes = append(sizes, len(items))
			mu.Unlock()
		}, batch.Options{MaxItems: 10, MaxWait: time.Millisecond})
		defer b.Close(context.Background())
		for i := range 95 {
			if !b.Add(i) {
				t.Fatalf("item %d refused", i)
			}
		}
		if err := b.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(got) != 95 {
			t.Fatalf("flush returned with %d of 95 items run", len(got))
		}
		for i, v := range got {
			if v != i {
				t.Fatalf("item %d is %d: out of order", i, v)
			}
		}
		for _, n := range sizes {
			if n > 10 {
				t.Fatalf("a batch of %d items, over MaxItems", n)
			}
		}
	})
}

func TestAddRefusesBeyondCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		b := batch.New(func(context.Context, []int) { <-release }, batch.Options{MaxItems: 1, Capacity: 3})
		defer func() { close(release); _ = b.Close(context.Background()) }()
		b.Add(0)        // taken by the worker, which blocks
		synctest.Wait() // the worker holds it
		if b.Len() != 0 {
			t.Fatalf("%d items wait; want item 0 taken by the worker", b.Len())
		}
		if !b.Add(1, 2, 3) {
			t.Fatal("three items refused with room for three")
		}
		if b.Add(4) {
			t.Fatal("a fourth waiting item was accepted beyond capacity 3")
		}
	})
}

func TestFlushWithSeveralWorkersWaitsForEarlierBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slow := make(chan struct{})
		var mu sync.Mutex
		ran := map[int]bool{}
		b := batch.New(func(_ context.Context, items []int) {
			if items[0] == 0 {
				<-slow
			}
			mu.Lock()
			for _, i := range items {
				ran[i] = true
			}
			mu.Unlock()
		}, batch.Options{MaxItems: 1, Workers: 3})
		defer b.Close(context.Background())
		b.Add(0)
		b.Add(1, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := b.Flush(ctx); err == nil {
			t.Fatal("flush returned while the batch of item 0 was still running")
		}
		close(slow)
		if err := b.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if !ran[0] || !ran[1] || !ran[2] {
			t.Fatalf("ran %v", ran)
		}
	})
}

func TestCloseRunsWhatIsQueuedThenRefuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n int
		b := batch.New(func(_ context.Context, items []int) { n += len(items) }, batch.Options{})
		b.Add(1, 2, 3)
		if err := b.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n != 3 {
			t.Fatalf("close ran %d of 3 items", n)
		}
		if b.Add(4) {
			t.Fatal("accepted an item after Close")
		}
	})
}

// A batch that gathers for long (a batched settle, marks written once a
// second) runs at once when someone flushes: Flush does not wait MaxWait.
func TestFlushCutsTheWaitShort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu  sync.Mutex
			got []int
		)
		b := batch.New(func(_ context.Context, items []int) {
			mu.Lock()
			got = append(got, items...)
			mu.Unlock()
		}, batch.Options{MaxWait: time.Hour})
		defer b.Close(context.Background())
		b.Add(1, 2, 3)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		if err := b.Flush(ctx); err != nil {
			t.Fatalf("flush of a batch waiting an hour: %v", err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("flush took %v on the bubble's clock, want no wait at all", d)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(got) != 3 {
			t.Fatalf("flush returned with %d of 3 items run", len(got))
		}
	})
}
