package logging

import (
	"bytes"
	"encoding/json"
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
