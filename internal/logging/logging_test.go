package logging

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/relaybus/relaybus/shared/event"
)

func TestCloudLoggingFields(t *testing.T) {
	var buf bytes.Buffer
	log := New(&buf, Options{ProjectID: "proj"})
	e := event.Event{ID: "e1", Type: "order.purchased", AggregateID: "A1", AggregateType: "order", Version: 2, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
	log.Warn("publish failed", Event(&e)...)
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"severity": "WARNING", "message": "publish failed", "event_id": "e1", "event_type": "order.purchased",
		"aggregate_id": "A1", "aggregate_type": "order", "version": float64(2), "trace_id": e.TraceID,
		"logging.googleapis.com/trace": "projects/proj/traces/" + e.TraceID,
	}
	for k, v := range want {
		if line[k] != v {
			t.Errorf("%s = %v, want %v (line %s)", k, line[k], v, buf.String())
		}
	}
	if _, ok := line["level"]; ok {
		t.Error("level still present")
	}
}

func TestSeverityAndLevels(t *testing.T) {
	for in, want := range map[string]string{"debug": "DEBUG", "INFO": "INFO", "warn": "WARNING", "error": "ERROR", "nonsense": "INFO"} {
		if got := Severity(ParseLevel(in)); got != want {
			t.Errorf("%s -> %s, want %s", in, got, want)
		}
	}
}

// A logger's With attributes come out with every line it logs, before the
// line's own, through groups and loggers derived from one another, and
// the trace field is added for a trace_id given to With; a line below the
// level writes nothing.
func TestWithAttributes(t *testing.T) {
	var buf bytes.Buffer
	base := New(&buf, Options{ProjectID: "proj", Level: slog.LevelInfo})
	trace := "4bf92f3577b34da6a3ce929d0e0e4736"
	a := base.With("consumer_id", "member-service", "trace_id", trace)
	b := a.With("attempt", 2)
	b.Debug("not written", "x", 1)
	a.Info("first", "n", 1)
	b.Warn("second", "n", 2)
	b.WithGroup("g").Error("third", "n", 3)
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	want := []string{
		`{"severity":"INFO","message":"first","consumer_id":"member-service","trace_id":"` + trace + `","n":1,"logging.googleapis.com/trace":"projects/proj/traces/` + trace + `"}`,
		`{"severity":"WARNING","message":"second","consumer_id":"member-service","trace_id":"` + trace + `","attempt":2,"n":2,"logging.googleapis.com/trace":"projects/proj/traces/` + trace + `"}`,
		`{"severity":"ERROR","message":"third","consumer_id":"member-service","trace_id":"` + trace + `","attempt":2,"logging.googleapis.com/trace":"projects/proj/traces/` + trace + `","g":{"n":3}}`,
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, l := range lines {
		var line map[string]any
		if err := json.Unmarshal(l, &line); err != nil {
			t.Fatalf("line %d: %v: %s", i, err, l)
		}
		delete(line, "time")
		got, _ := json.Marshal(line)
		var w map[string]any
		_ = json.Unmarshal([]byte(want[i]), &w)
		wb, _ := json.Marshal(w)
		if string(got) != string(wb) {
			t.Errorf("line %d:\n got %s\nwant %s", i, got, wb)
		}
	}
	// Order: With's attributes before the line's own.
	if i, j := bytes.Index(lines[1], []byte(`"attempt"`)), bytes.Index(lines[1], []byte(`"n"`)); i < 0 || j < i {
		t.Errorf("With's attributes do not come first: %s", lines[1])
	}
}

// With formats nothing until a line is logged: a logger built per request
// with a delivery's fields, which logs nothing at its level, costs a few
// allocations, not a formatted buffer per attribute.
func TestWithFormatsOnlyWhatIsLogged(t *testing.T) {
	var buf bytes.Buffer
	base := New(&buf, Options{ProjectID: "proj", Level: slog.LevelError})
	e := event.Event{ID: "e1", Type: "order.purchased", AggregateID: "A1", AggregateType: "order", Version: 2, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736"}
	allocs := testing.AllocsPerRun(200, func() {
		l := base.With("consumer_id", "member-service", "message_id", "m-1", "delivery_attempt", 1)
		l = l.With(Event(&e)...)
		l.Info("consume: applied", "emitted", 0)
	})
	if buf.Len() > 0 {
		t.Fatalf("a line below the level was written: %s", buf.String())
	}
	// Formatted ahead (slog's JSON handler's own WithAttrs) it took 32
	// (Go 1.26), and its buffers.
	if allocs > 24 {
		t.Errorf("%.0f allocations to build a request's logger and not log, want at most 24", allocs)
	}
}
