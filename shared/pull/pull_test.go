package pull

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/delivery"
	"github.com/relaybus/relaybus/shared/event"
)

func TestNewNamesTheMissingOption(t *testing.T) {
	_, err := New(Options{})
	if err == nil || !strings.Contains(err.Error(), "Options.Source is required") {
		t.Fatalf("New(Options{}) = %v, want the missing Source named", err)
	}
}

// A pull that fails after the broker leased it messages (a batch cut
// short) returns them with its error; the worker delivers them instead of
// leaving their leases to lapse.
func TestMessagesOfAFailedPullAreDelivered(t *testing.T) {
	src := &cutShort{}
	eng := engineFunc(func(_ context.Context, d delivery.Delivery) Answer {
		return Answer{Status: http.StatusOK}
	})
	w, err := New(Options{Source: src, Subscription: "s", Engine: eng, DeadLetters: discard{}, MinBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for !src.acked.Load() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !src.acked.Load() {
		t.Fatal("the message a failed pull returned was never delivered and acknowledged")
	}
}

// engineFunc adapts a function to Engine.
type engineFunc func(context.Context, delivery.Delivery) Answer

func (f engineFunc) Handle(ctx context.Context, d delivery.Delivery) Answer { return f(ctx, d) }

// cutShort returns one message with an error on its first pull, then
// nothing.
type cutShort struct {
	pulls atomic.Int32
	acked atomic.Bool
}

func (s *cutShort) Pull(ctx context.Context, _ string, _ int) ([]Leased, error) {
	if s.pulls.Add(1) == 1 {
		return []Leased{&lease{s: s}}, errors.New("status 409 Leadership Change")
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Millisecond):
	}
	return nil, nil
}

type lease struct{ s *cutShort }

func (l *lease) Message() event.Message {
	return event.Message{ID: "m-1", OrderingKey: "k", Attributes: map[string]string{event.AttrEventID: "e-1"}}
}
func (l *lease) Ack(context.Context) error                 { l.s.acked.Store(true); return nil }
func (l *lease) Nack(context.Context, time.Duration) error { return nil }
func (l *lease) Extend(context.Context) error              { return nil }

type discard struct{}

func (discard) Publish(context.Context, string, event.Message) (string, error) { return "", nil }
