package instance_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/functions/publish"
	relayfn "github.com/relaybus/relaybus/functions/relay"
	"github.com/relaybus/relaybus/functions/rollup"
	"github.com/relaybus/relaybus/internal/instance"
)

// Every function's configuration declares each variable once (the shared
// pieces are embedded, never restated), and every variable has the same
// declaration in every function that reads it.
func TestEachVariableIsDeclaredOnce(t *testing.T) {
	configs := map[string]reflect.Type{
		"publish":   reflect.TypeOf(publish.Config{}),
		"relay":     reflect.TypeOf(relayfn.Config{}),
		"consume":   reflect.TypeOf(consume.Config{}),
		"rollup":    reflect.TypeOf(rollup.Config{}),
		"dlqreplay": reflect.TypeOf(dlqreplay.Config{}),
	}
	declaredIn := map[string]string{} // variable -> "pkg.Type.Field"
	for fn, typ := range configs {
		seen := map[string]bool{}
		walk(typ, func(owner reflect.Type, f reflect.StructField, name string) {
			if seen[name] {
				t.Errorf("%s: %s is declared twice in its Config", fn, name)
			}
			seen[name] = true
			where := owner.PkgPath() + "." + owner.Name() + "." + f.Name
			if prev, ok := declaredIn[name]; ok && prev != where {
				t.Errorf("%s is declared in %s and again in %s", name, prev, where)
			}
			declaredIn[name] = where
		})
	}
	for _, shared := range []string{"GOOGLE_CLOUD_PROJECT", "FIRESTORE_DATABASE", "LEDGER_RETENTION", "LEDGER", "DATABASE_URL", "SHUTDOWN_TIMEOUT"} {
		if !strings.HasPrefix(declaredIn[shared], "github.com/relaybus/relaybus/internal/instance.") {
			t.Errorf("%s is declared in %q, want one of internal/instance's pieces", shared, declaredIn[shared])
		}
	}
}

// walk calls f for every env-tagged field of t, through nested structs.
func walk(t reflect.Type, f func(owner reflect.Type, field reflect.StructField, name string)) {
	for i := 0; i < t.NumField(); i++ {
		field := t.Field(i)
		if tag, ok := field.Tag.Lookup("env"); ok {
			name, _, _ := strings.Cut(tag, ",")
			f(t, field, strings.TrimSpace(name))
			continue
		}
		if field.Type.Kind() == reflect.Struct {
			walk(field.Type, f)
		}
	}
}

// The local stack and the tests start from Defaults: every function's
// Config has one (no variable is "required" by tag; Build says what is
// missing).
func TestEveryFunctionsConfigHasDefaults(t *testing.T) {
	if c := instance.Defaults[consume.Config](); c.Handler != "projection" || c.MaxDeliveryAttempts != 5 {
		t.Errorf("consume defaults: %+v", c)
	}
	if c := instance.Defaults[publish.Config](); !c.FastPath || c.Relay.BatchSize != 1000 || c.Ledger.Mode != "firestore" {
		t.Errorf("publish defaults: %+v", c)
	}
	if c := instance.Defaults[relayfn.Config](); len(c.Databases) != 1 || c.Databases[0] != "main" {
		t.Errorf("relay defaults: %+v", c)
	}
	_ = instance.Defaults[rollup.Config]()
	if c := instance.Defaults[dlqreplay.Config](); c.Auth != "iam" {
		t.Errorf("dlqreplay defaults: %+v", c)
	}
}
