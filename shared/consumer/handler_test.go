package consumer

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relaybus/relaybus/shared/event"
)

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err   error
		class Class
		code  string
	}{
		{Permanent("insufficient_stock", errors.New("sold out")), ClassPermanent, "insufficient_stock"},
		{fmt.Errorf("wrapped: %w", Permanent("x", errors.New("y"))), ClassPermanent, "x"},
		{Poison("bad_payload", errors.New("not JSON")), ClassPoison, "bad_payload"},
		{Transient("downstream", errors.New("503")), ClassTransient, "downstream"},
		{fmt.Errorf("%w: v3 after v1", ErrGap), ClassTransient, "gap"},
		{fmt.Errorf("%w: a.b v9", ErrNoHandler), ClassPoison, "no_handler"},
		{context.DeadlineExceeded, ClassTransient, "timeout"},
		{fmt.Errorf("projection: %w", &pgconn.PgError{Code: "57014", Message: "canceling statement due to user request"}), ClassTransient, "timeout"},
		{&pgconn.PgError{Code: "23505"}, ClassTransient, "error"},
		{errors.New("anything else"), ClassTransient, "error"},
	} {
		class, code := Classify(c.err)
		if class != c.class || code != c.code {
			t.Errorf("Classify(%v) = %d %q, want %d %q", c.err, class, code, c.class, c.code)
		}
	}
}

func TestMuxPicksTheMostSpecificHandler(t *testing.T) {
	m := NewMux()
	route := func(name string) HandlerFunc {
		return func(context.Context, *Context) error { return errors.New(name) }
	}
	m.Register("order.purchased", "v1", route("type+version"))
	m.Register("order.purchased", Any, route("type"))
	m.Register(Any, "v2", route("version"))
	for _, c := range []struct{ typ, version, want string }{
		{"order.purchased", "v1", "type+version"},
		{"order.purchased", "v3", "type"},
		{"order.cancelled", "v2", "version"},
		{"order.cancelled", "v1", "no handler"},
	} {
		err := m.Handle(context.Background(), &Context{Event: &event.Event{Type: c.typ, SchemaVersion: c.version}})
		got := err.Error()
		if c.want == "no handler" {
			if !errors.Is(err, ErrNoHandler) {
				t.Errorf("%s %s: %v, want ErrNoHandler", c.typ, c.version, err)
			}
			continue
		}
		if got != c.want {
			t.Errorf("%s %s routed to %q, want %q", c.typ, c.version, got, c.want)
		}
	}
	m.Register(Any, Any, route("catch-all"))
	if err := m.Handle(context.Background(), &Context{Event: &event.Event{Type: "x.y", SchemaVersion: "v1"}}); err.Error() != "catch-all" {
		t.Errorf("catch-all: %v", err)
	}
}
