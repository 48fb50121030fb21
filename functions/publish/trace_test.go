package publish

import "testing"

func TestParseTraceparent(t *testing.T) {
	for _, c := range []struct {
		in          string
		trace, span string
		ok          bool
	}{
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", true},
		{" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 ", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", true},
		// A later version may append fields; version 00 may not.
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", true},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "", "", false},
		{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "", "", false},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "", "", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "", "", false},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "", "", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", "", "", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", "", "", false},
		{"", "", "", false},
	} {
		tc, ok := parseTraceparent(c.in)
		if ok != c.ok || tc.traceID != c.trace || tc.spanID != c.span {
			t.Errorf("parseTraceparent(%q) = %+v, %v; want %s %s %v", c.in, tc, ok, c.trace, c.span, c.ok)
		}
	}
}
