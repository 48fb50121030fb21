package devstack

import (
	"sync"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
)

// Wakeup tells the delivery loop the moment a topic receives messages, so
// that it pulls at once instead of polling. In-process pstest reports every
// Publish through a reactor (Reactor); pstest's own Pull has no such
// signal (without ReturnImmediately it waits a fixed 500 ms when nothing
// is there). The gcloud emulator needs none: its Pull without
// ReturnImmediately returns as soon as a message arrives.
type Wakeup struct {
	mu        sync.Mutex
	listeners map[string][]chan struct{} // by topic path
}

// NewWakeup returns a Wakeup with no listeners.
func NewWakeup() *Wakeup { return &Wakeup{listeners: map[string][]chan struct{}{}} }

// Reactor returns the pstest option that reports each Publish to w. Pass
// it to pstest (pstestserver.Options.Reactors). It never blocks and never handles the request
// itself: pstest publishes as always.
func (w *Wakeup) Reactor() pstest.ServerReactorOption {
	return pstest.ServerReactorOption{FuncName: "Publish", Reactor: publishReactor{w}}
}

type publishReactor struct{ w *Wakeup }

// React is called by pstest under its server lock, before the messages are
// stored; a puller woken by it waits for that lock and then sees them.
func (r publishReactor) React(req any) (bool, any, error) {
	if p, ok := req.(*pb.PublishRequest); ok {
		r.w.Notify(p.GetTopic())
	}
	return false, nil, nil
}

// Notify wakes every listener of topic (a full topic path).
func (w *Wakeup) Notify(topic string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.listeners[topic] {
		select {
		case c <- struct{}{}:
		default: // already pending: one wake covers any number of publishes
		}
	}
}

// listen returns a channel that receives (coalesced) wakes for topic.
func (w *Wakeup) listen(topic string) <-chan struct{} {
	c := make(chan struct{}, 1)
	w.mu.Lock()
	w.listeners[topic] = append(w.listeners[topic], c)
	w.mu.Unlock()
	return c
}

// unlisten removes a channel listen returned.
func (w *Wakeup) unlisten(topic string, c <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ls := w.listeners[topic]
	for i, l := range ls {
		if l == c {
			w.listeners[topic] = append(ls[:i:i], ls[i+1:]...)
			break
		}
	}
}
