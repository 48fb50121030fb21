// Package batch runs a function over items in batches, in the background:
// callers hand items over one at a time and go on at once, and a worker
// gathers what has arrived (up to a size, or for at most a short wait) and
// runs the function over the lot. relaybus uses it to record the ledger
// after the fact: sends and attempts are written to Firestore in batches,
// off the delivery path, with a bounded queue that refuses rather than
// grows (what it refuses is shipped later from Postgres).
package batch

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Defaults of Options.
const (
	DefaultMaxItems = 500
	DefaultMaxWait  = 2 * time.Millisecond
	DefaultCapacity = 10_000
)

// Options tune a Batcher. The zero value takes the defaults.
type Options struct {
	// MaxItems is the most items one batch holds (DefaultMaxItems).
	MaxItems int
	// MaxWait is how long a batch waits to fill once its first item has
	// arrived (DefaultMaxWait); a batch that reaches MaxItems goes at once.
	MaxWait time.Duration
	// Capacity is the most items waiting; Add refuses items beyond it
	// (DefaultCapacity).
	Capacity int
	// Workers is how many batches run at once (1: one after the other, in
	// the order their items arrived).
	Workers int
}

// Batcher gathers items and runs its function over them in batches. It is
// safe for concurrent use.
type Batcher[T any] struct {
	run func(ctx context.Context, items []T)
	o   Options

	mu      sync.Mutex
	queue   []T
	added   uint64          // items accepted so far
	taken   uint64          // items handed to a batch so far
	running map[uint64]bool // the batches running, by their first item's number
	closed  bool
	wake    chan struct{}
	// flushed cuts a batch's wait short: a Flush or Close wants what is
	// queued run now.
	flushed chan struct{}
	changed *sync.Cond

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New starts a batcher that calls run with each batch, in the background.
// run gets a context that ends when the batcher is closed; it should bound
// its own work.
func New[T any](run func(ctx context.Context, items []T), o Options) *Batcher[T] {
	if o.MaxItems <= 0 {
		o.MaxItems = DefaultMaxItems
	}
	if o.MaxWait <= 0 {
		o.MaxWait = DefaultMaxWait
	}
	if o.Capacity <= 0 {
		o.Capacity = DefaultCapacity
	}
	if o.Workers <= 0 {
		o.Workers = 1
	}
	b := &Batcher[T]{run: run, o: o, wake: make(chan struct{}, 1), flushed: make(chan struct{}, 1), running: map[uint64]bool{}}
	b.changed = sync.NewCond(&b.mu)
	b.ctx, b.cancel = context.WithCancel(context.Background())
	for range o.Workers {
		b.wg.Add(1)
		go b.work()
	}
	return b
}

// Add queues items and returns at once. It returns false, and queues
// nothing, when they do not all fit or the batcher is closed.
func (b *Batcher[T]) Add(items ...T) bool {
	if len(items) == 0 {
		return true
	}
	b.mu.Lock()
	if b.closed || len(b.queue)+len(items) > b.o.Capacity {
		b.mu.Unlock()
		return false
	}
	b.queue = append(b.queue, items...)
	b.added += uint64(len(items))
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	return true
}

// Len returns how many items wait for a batch.
func (b *Batcher[T]) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// Flush waits until every item added before the call has been through its
// batch, or ctx ends. A batch filling up runs at once, without waiting out
// MaxWait.
func (b *Batcher[T]) Flush(ctx context.Context) error {
	b.mu.Lock()
	target := b.added
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	select {
	case b.flushed <- struct{}{}:
	default:
	}
	stop := context.AfterFunc(ctx, func() {
		b.mu.Lock()
		b.changed.Broadcast()
		b.mu.Unlock()
	})
	defer stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for !b.finished(target) {
		if err := ctx.Err(); err != nil {
			return err
		}
		b.changed.Wait()
	}
	return nil
}

// finished reports whether the first n items have been through their
// batches. Call it with b.mu held.
func (b *Batcher[T]) finished(n uint64) bool {
	if b.taken < n {
		return false
	}
	for start := range b.running {
		if start < n {
			return false
		}
	}
	return true
}

// ErrClosed is returned by Close when ctx ended before the last batches
// finished; they are abandoned.
var ErrClosed = errors.New("batch: closed before every batch ran")

// Close refuses new items, runs what is queued and waits for it, or until
// ctx ends (then the running batches' context is cancelled and the items
// still queued are dropped).
func (b *Batcher[T]) Close(ctx context.Context) error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	err := b.Flush(ctx)
	b.cancel()
	b.wg.Wait()
	if err != nil {
		return ErrClosed
	}
	return nil
}

func (b *Batcher[T]) work() {
	defer b.wg.Done()
	for {
		b.mu.Lock()
		empty, closed := len(b.queue) == 0, b.closed
		b.mu.Unlock()
		if empty {
			if closed || b.ctx.Err() != nil {
				return
			}
			select {
			case <-b.wake:
			case <-b.ctx.Done():
				return
			}
			continue
		}
		// Let the batch fill for MaxWait unless it is full already or a
		// Flush wants it now.
		if b.Len() < b.o.MaxItems {
			t := time.NewTimer(b.o.MaxWait)
			select {
			case <-t.C:
			case <-b.flushed:
				t.Stop()
			case <-b.ctx.Done():
				t.Stop()
			}
		}
		b.mu.Lock()
		n := min(len(b.queue), b.o.MaxItems)
		items := make([]T, n)
		copy(items, b.queue)
		b.queue = b.queue[n:]
		if len(b.queue) == 0 {
			b.queue = nil // let the backing array go
		}
		start := b.taken
		b.taken += uint64(n)
		if n > 0 {
			b.running[start] = true
		}
		b.mu.Unlock()
		if n == 0 {
			continue
		}
		if b.ctx.Err() == nil {
			b.run(b.ctx, items)
		}
		b.mu.Lock()
		delete(b.running, start)
		b.changed.Broadcast()
		b.mu.Unlock()
	}
}
