package event

import (
	"testing"
)

// The versions of one change come newest first, on consecutive aggregate
// versions, with one trace and span and ids ChangeOf reads back.
func TestSideBySide(t *testing.T) {
	change := &Event{ID: "c-1", Type: "order.purchased", Topic: "shop.order.events", AggregateID: "o-1", Version: 4}
	evs, err := SideBySide(change, Encoded{SchemaVersion: "v1", Payload: []byte(`1`)},
		Encoded{SchemaVersion: "v10", Payload: []byte(`10`)}, Encoded{SchemaVersion: "v2", Payload: []byte(`2`)})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		id, schema string
		version    int64
	}{{"c-1.v10", "v10", 4}, {"c-1.v2", "v2", 5}, {"c-1.v1", "v1", 6}}
	for i, w := range want {
		e := evs[i]
		if e.ID != w.id || e.SchemaVersion != w.schema || e.Version != w.version || string(e.Payload) != w.schema[1:] {
			t.Errorf("event %d: %s %s v%d %s, want %+v", i, e.ID, e.SchemaVersion, e.Version, e.Payload, w)
		}
		if e.TraceID == "" || e.TraceID != evs[0].TraceID || e.SpanID != evs[0].SpanID || !e.OccurredAt.Equal(evs[0].OccurredAt) {
			t.Errorf("event %d does not share the change's trace, span and time", i)
		}
		if id, ok := ChangeOf(e); !ok || id != "c-1" {
			t.Errorf("ChangeOf(%s) = %q, %v", e.ID, id, ok)
		}
	}
	for _, e := range []*Event{{ID: "c-1.v2", SchemaVersion: "v1"}, {ID: "c-1", SchemaVersion: "v1"}, {ID: ".v1", SchemaVersion: "v1"}} {
		if _, ok := ChangeOf(e); ok {
			t.Errorf("ChangeOf(%s %s): an event of one version taken for a side-by-side change", e.ID, e.SchemaVersion)
		}
	}
}
