// Package pullengine adapts the consume engine to the pull worker: the
// engine's result as the worker's answer, and the consumer's own pause
// (inbox.PauseFlags) as a hold of what the worker holds and a stop of its
// pulling. consume's pull mode is built with it.
package pullengine

import (
	"context"
	"net/http"
	"time"

	"github.com/relaybus/relaybus/internal/delivery"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/pull"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
)

// CodePaused is the answer's code for a delivery held while its consumer
// is paused.
const CodePaused = "paused"

// New is the pull worker's engine: e, answering with a hold (no attempt)
// what it is handed while the consumer is paused on the delivery's topic
// (pauses nil: never).
func New(e *consumer.Engine, pauses *inbox.PauseFlags) pull.Engine {
	return engine{e: e, pauses: pauses}
}

// Paused is the pull worker's Options.Paused for a consumer pulling
// topic: whether pauses has it paused there (pauses nil: never).
func Paused(pauses *inbox.PauseFlags, topic string) func(context.Context) (bool, time.Duration) {
	if pauses == nil {
		return nil
	}
	return func(ctx context.Context) (bool, time.Duration) {
		p, _ := pauses.Paused(ctx, topic)
		return p, every(pauses)
	}
}

func every(p *inbox.PauseFlags) time.Duration {
	if p.Every > 0 {
		return p.Every
	}
	return inbox.DefaultPauseEvery
}

type engine struct {
	e      *consumer.Engine
	pauses *inbox.PauseFlags
}

func (p engine) Handle(ctx context.Context, d delivery.Delivery) pull.Answer {
	if p.pauses != nil {
		if paused, _ := p.pauses.Paused(ctx, d.Topic()); paused {
			return pull.Answer{Status: http.StatusServiceUnavailable, Code: CodePaused, EventID: d.Message.Attributes[event.AttrEventID],
				Error: "the consumer is paused", Held: true, RetryAfter: every(p.pauses)}
		}
	}
	r := p.e.Handle(ctx, d)
	return pull.Answer{Status: r.Status, Attempt: r.Attempt, EventID: r.EventID, Code: r.Code, Error: r.Error,
		Held: r.Held(), RetryAfter: r.RetryAfter}
}
