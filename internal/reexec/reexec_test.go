package reexec

import (
	"strings"
	"testing"
)

// An entry made by Env reads back as its role and argument, an argument
// with colons (a URL) included.
func TestEnvReadsBackAsRole(t *testing.T) {
	for _, c := range []struct{ role, arg string }{
		{"function", "consume"}, {"claim", "postgres://u:p@127.0.0.1:5432/db?search_path=s"}, {"child", ""},
	} {
		k, v, _ := strings.Cut(Env(c.role, c.arg), "=")
		t.Setenv(k, v)
		if role, arg := Role(); role != c.role || arg != c.arg {
			t.Errorf("Env(%q, %q) reads back as %q, %q", c.role, c.arg, role, arg)
		}
	}
	t.Setenv(env, "")
	if role, arg := Role(); role != "" || arg != "" {
		t.Errorf("no role set: %q, %q", role, arg)
	}
}
