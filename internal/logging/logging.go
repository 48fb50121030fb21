// Package logging builds relaybus's structured logger: JSON lines on log/slog
// that Cloud Logging understands (severity, message, trace correlation), and
// the event fields the conventions ask every line about an event to carry
// (event_id, event_type, aggregate_id, aggregate_type, version, trace_id).
package logging

import (
	"context"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/relaybus/relaybus/shared/event"
)

// Options configure New.
type Options struct {
	// Level is the minimum level logged; nil means Info.
	Level slog.Leveler
	// ProjectID, when set, turns trace_id fields into Cloud Logging's
	// logging.googleapis.com/trace so log lines join their trace (the
	// functions pass their GOOGLE_CLOUD_PROJECT).
	ProjectID string
}

// New returns a JSON logger writing to w (os.Stderr when nil) whose records
// carry "severity" (DEBUG, INFO, WARNING, ERROR) and "message" as Cloud
// Logging expects.
func New(w io.Writer, opts Options) *slog.Logger {
	if w == nil {
		w = os.Stderr
	}
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level: opts.Level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.LevelKey:
				return slog.String("severity", Severity(a.Value.Any().(slog.Level)))
			case slog.MessageKey:
				a.Key = "message"
			}
			return a
		},
	})
	var inner slog.Handler = h
	if opts.ProjectID != "" {
		inner = traceHandler{Handler: h, project: opts.ProjectID}
	}
	return slog.New(lazyHandler{inner: inner})
}

// lazyHandler keeps the attributes of Logger.With as they are and hands
// them to its inner handler only with a record that is logged. The JSON
// handler formats With's attributes at once, whether anything is logged
// or not; the hot paths build a logger with a delivery's or an event's
// fields for every request and mostly log nothing below WARNING, so
// formatting them ahead was most of their logging cost (see
// docs/records/2026-11-26-cpu-per-event.md). A line comes out the same: With's attributes first,
// then the record's.
type lazyHandler struct {
	inner slog.Handler
	attrs []slog.Attr  // this With's, not yet formatted
	outer *lazyHandler // the logger this one was derived from, whose attributes come first
}

func (h lazyHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h lazyHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.attrs == nil {
		return h.inner.Handle(ctx, r)
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	h.addTo(&out)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(a)
		return true
	})
	return h.inner.Handle(ctx, out)
}

// addTo adds the attributes of every With, outermost first.
func (h *lazyHandler) addTo(r *slog.Record) {
	if h.outer != nil {
		h.outer.addTo(r)
	}
	r.AddAttrs(h.attrs...)
}

// WithAttrs keeps attrs, which the handler owns (slog.Handler's contract),
// and the logger it derives from: nothing is copied or formatted.
func (h lazyHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	var outer *lazyHandler
	if h.attrs != nil {
		outer = &h
	}
	return lazyHandler{inner: h.inner, attrs: attrs, outer: outer}
}

// all returns the attributes of every With, outermost first.
func (h *lazyHandler) all() []slog.Attr {
	var as []slog.Attr
	if h.outer != nil {
		as = h.outer.all()
	}
	return append(as, h.attrs...)
}

// WithGroup formats the attributes so far under no group, as the JSON
// handler would have, and opens the group on the inner handler.
func (h lazyHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	inner := h.inner
	if h.attrs != nil {
		inner = inner.WithAttrs(h.all())
	}
	return lazyHandler{inner: inner.WithGroup(name)}
}

// traceHandler adds Cloud Logging's trace field next to a W3C trace_id.
type traceHandler struct {
	slog.Handler
	project string
}

func (h traceHandler) traceAttr(a slog.Attr) (slog.Attr, bool) {
	if a.Key != "trace_id" || len(a.Value.String()) != 32 {
		return slog.Attr{}, false
	}
	return slog.String("logging.googleapis.com/trace", "projects/"+h.project+"/traces/"+a.Value.String()), true
}

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	var extra slog.Attr
	found := false
	r.Attrs(func(a slog.Attr) bool {
		extra, found = h.traceAttr(a)
		return !found
	})
	if found {
		r = r.Clone()
		r.AddAttrs(extra)
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	for _, a := range attrs {
		if extra, ok := h.traceAttr(a); ok {
			attrs = append(attrs[:len(attrs):len(attrs)], extra)
			break
		}
	}
	return traceHandler{Handler: h.Handler.WithAttrs(attrs), project: h.project}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{Handler: h.Handler.WithGroup(name), project: h.project}
}

// ParseLevel reads debug, info, warn or error (any case); anything else is Info.
func ParseLevel(s string) slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.TrimSpace(s))); err != nil {
		return slog.LevelInfo
	}
	return l
}

// Severity maps a slog level to Cloud Logging's severity names.
func Severity(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "ERROR"
	case l >= slog.LevelWarn:
		return "WARNING"
	case l >= slog.LevelInfo:
		return "INFO"
	}
	return "DEBUG"
}

// Event returns the conventions' log fields for an event.
func Event(e *event.Event) []any {
	return []any{
		slog.String("event_id", e.ID),
		slog.String("event_type", e.Type),
		slog.String("aggregate_id", e.AggregateID),
		slog.String("aggregate_type", e.AggregateType),
		slog.Int64("version", e.Version),
		slog.String("trace_id", e.TraceID),
	}
}

// Discard returns a logger that writes nothing, for tests and benchmarks.
func Discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

type ctxKey struct{}

// WithLogger returns a context carrying l.
func WithLogger(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, ctxKey{}, l)
}

// From returns the logger in ctx, or slog.Default().
func From(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(ctxKey{}).(*slog.Logger); ok {
		return l
	}
	return slog.Default()
}
