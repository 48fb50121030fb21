package broker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// plain is a broker with no capability.
type plain struct{}

func (plain) Publish(context.Context, string, event.Message) (string, error) { return "", nil }
func (plain) PublishBatch(context.Context, string, []event.Message) (int, error) {
	return 0, nil
}
func (plain) Pull(context.Context, string, int) ([]broker.Lease, error) { return nil, nil }
func (plain) Provision(context.Context, *topology.Topology) error       { return nil }
func (plain) Close() error                                              { return nil }

// seeking is a broker that seeks to a time.
type seeking struct{ plain }

func (seeking) SeekTime(context.Context, string, time.Time) error { return nil }

// wrapped wraps another broker, as a decorator would.
type wrapped struct {
	plain
	inner broker.Broker
}

func (w wrapped) Unwrap() broker.Broker { return w.inner }

// pointerSeeking seeks through a pointer receiver: a nil one would panic.
type pointerSeeking struct{ plain }

func (p *pointerSeeking) SeekTime(context.Context, string, time.Time) error {
	p.plain = plain{} // dereferences p
	return nil
}

// loop unwraps to itself, as a careless decorator might.
type loop struct{ plain }

func (l *loop) Unwrap() broker.Broker { return l }

func TestAsFindsACapabilityOrSaysItIsMissing(t *testing.T) {
	for _, tc := range []struct {
		name       string
		b          broker.Broker
		seek, snap bool
	}{
		{"no capability", plain{}, false, false},
		{"its own", seeking{}, true, false},
		{"through a wrapper", wrapped{inner: seeking{}}, true, false},
		{"through two wrappers", wrapped{inner: wrapped{inner: seeking{}}}, true, false},
		{"a wrapper of nothing", wrapped{}, false, false},
		{"nil", nil, false, false},
		{"a nil pointer", (*pointerSeeking)(nil), false, false},
		{"a wrapper of a nil pointer", wrapped{inner: (*pointerSeeking)(nil)}, false, false},
		{"a pointer", &pointerSeeking{}, true, false},
		{"a wrapper of itself", &loop{}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, ok := broker.As[broker.TimeSeeker](tc.b)
			if ok != tc.seek || (ok && ts == nil) {
				t.Errorf("As[TimeSeeker] = %v, %v; want ok %v", ts, ok, tc.seek)
			}
			if _, ok := broker.As[broker.Snapshotter](tc.b); ok != tc.snap {
				t.Errorf("As[Snapshotter] ok %v, want %v", ok, tc.snap)
			}
		})
	}
}

func TestErrorMatchesItsKindAndTheDriversError(t *testing.T) {
	driver := errors.New("rpc error: code = NotFound")
	var err error = &broker.Error{Kind: broker.ErrNotFound, Reason: "no such subscription", Err: driver}
	if !errors.Is(err, broker.ErrNotFound) || !errors.Is(err, driver) || errors.Is(err, broker.ErrRefused) {
		t.Errorf("errors.Is: NotFound %v, driver %v, Refused %v; want true, true, false",
			errors.Is(err, broker.ErrNotFound), errors.Is(err, driver), errors.Is(err, broker.ErrRefused))
	}
	var be *broker.Error
	if !errors.As(err, &be) || be.Reason != "no such subscription" || err.Error() != "no such subscription" {
		t.Errorf("errors.As: %v %+v; want the reason", err, be)
	}
}
