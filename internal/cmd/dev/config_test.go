package main

import (
	"context"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/devstack"
	"github.com/relaybus/relaybus/internal/instance"
)

// unset unsets each variable for the test (restored afterwards).
func unset(t *testing.T, vars ...string) {
	t.Helper()
	for _, k := range vars {
		t.Setenv(k, "")
		if err := os.Unsetenv(k); err != nil {
			t.Fatal(err)
		}
	}
}

// The functions' variables make dev honours reach the stack as the
// functions read them, a function's tuning included.
func TestConfigReadsTheFunctionsVariables(t *testing.T) {
	for k, v := range map[string]string{
		"DATABASE_URL":            "postgres://u@db.example:5432/main",
		"PUBSUB_EMULATOR_HOST":    "127.0.0.1:8085",
		"FIRESTORE_EMULATOR_HOST": "127.0.0.1:8086",
		"RELAYBUS_TOPOLOGY":       "/tmp/topology.yaml",
		"TRANSPORT":               "nats",
		"NATS_URL":                "nats://127.0.0.1:4222",
		"GOOGLE_CLOUD_PROJECT":    "other-project",
		"LOG_LEVEL":               "debug",
		"FORWARD_SIGNING_SECRET":  "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0",
		"PUBLISH_MAX_IN_FLIGHT":   "7",
		"ROLLUP_WINDOW":           "3s",
	} {
		t.Setenv(k, v)
	}
	cfg, err := devstack.LoadConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	o := parseFlags(flag.NewFlagSet("dev", flag.PanicOnError), nil).apply(cfg.Options())
	got := []string{o.DatabaseURL, o.PubSubHost, o.FirestoreHost, o.Topology, o.Transport, o.NATSURL, o.Project, o.Functions.Consume.ForwardSigningSecret,
		cfg.Functions.Publish.LogLevel}
	want := []string{"postgres://u@db.example:5432/main", "127.0.0.1:8085", "127.0.0.1:8086", "/tmp/topology.yaml", "nats", "nats://127.0.0.1:4222", "other-project",
		"whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0", "debug"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("options from the environment:\n got %q\nwant %q", got, want)
	}
	if o.Functions.Publish.MaxInFlight != 7 || o.Functions.Rollup.Window.String() != "3s" {
		t.Errorf("PUBLISH_MAX_IN_FLIGHT=7, ROLLUP_WINDOW=3s: the stack builds publish with %d, rollup with %v", o.Functions.Publish.MaxInFlight, o.Functions.Rollup.Window)
	}
}

// Unset, every variable has its one default: the functions' tags (LOG_LEVEL,
// TRANSPORT: make dev logs at what production logs at), and the stack's
// constants, which are also the flags' defaults.
func TestConfigDefaultsAreWrittenOnce(t *testing.T) {
	unset(t, "LOG_LEVEL", "TRANSPORT", "GOOGLE_CLOUD_PROJECT", "RELAYBUS_DEV_ADDR", "RELAYBUS_DEV_PG_BUDGET", "PUBLISH_MAX_IN_FLIGHT")
	cfg, err := devstack.LoadConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fn := instance.Defaults[publish.Config]()
	if cfg.Functions.Publish.LogLevel != fn.LogLevel || cfg.Functions.Publish.PubSub.Transport != fn.PubSub.Transport {
		t.Errorf("make dev's LOG_LEVEL %q and TRANSPORT %q, the functions' %q and %q", cfg.Functions.Publish.LogLevel, cfg.Functions.Publish.PubSub.Transport, fn.LogLevel, fn.PubSub.Transport)
	}
	if cfg.Functions.Publish.MaxInFlight != publish.DefaultMaxInFlight {
		t.Errorf("unset PUBLISH_MAX_IN_FLIGHT: %d, publish's default is %d", cfg.Functions.Publish.MaxInFlight, publish.DefaultMaxInFlight)
	}
	o := parseFlags(flag.NewFlagSet("dev", flag.PanicOnError), nil).apply(cfg.Options())
	if o.Addr != devstack.DefaultAddr || o.Project != devstack.DefaultProject || o.PostgresBudget != devstack.DefaultPostgresBudget ||
		o.StateDir != devstack.DefaultStateDir || o.BackoffScale != devstack.DefaultBackoffScale {
		t.Errorf("nothing set: addr %q, project %q, budget %d, state %q, backoff ×%g; want the stack's defaults", o.Addr, o.Project, o.PostgresBudget, o.StateDir, o.BackoffScale)
	}
}

// A flag given wins over its variable, which wins over the default.
func TestFlagsOverTheEnvironment(t *testing.T) {
	t.Setenv("RELAYBUS_DEV_ADDR", "127.0.0.1:9090")
	t.Setenv("RELAYBUS_DEV_PG_BUDGET", "60")
	t.Setenv("GOOGLE_CLOUD_PROJECT", "env-project")
	cfg, err := devstack.LoadConfig(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	o := parseFlags(flag.NewFlagSet("dev", flag.PanicOnError), nil).apply(cfg.Options())
	if o.Addr != "127.0.0.1:9090" || o.PostgresBudget != 60 || o.Project != "env-project" {
		t.Errorf("no flags: addr %q, budget %d, project %q; want the environment's", o.Addr, o.PostgresBudget, o.Project)
	}
	o = parseFlags(flag.NewFlagSet("dev", flag.PanicOnError), []string{"-addr", "127.0.0.1:7070", "-pg-budget", "30", "-project", "flag-project"}).apply(cfg.Options())
	if o.Addr != "127.0.0.1:7070" || o.PostgresBudget != 30 || o.Project != "flag-project" {
		t.Errorf("flags given: addr %q, budget %d, project %q; want the flags'", o.Addr, o.PostgresBudget, o.Project)
	}
}

// An invalid value is an error naming the variable, as the functions'.
func TestConfigNamesAnInvalidVariable(t *testing.T) {
	for k, v := range map[string]string{"SHUTDOWN_TIMEOUT": "often", "RELAYBUS_DEV_PG_BUDGET": "-3", "PUBLISH_MAX_IN_FLIGHT": "many"} {
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, v)
			_, err := devstack.LoadConfig(context.Background())
			if err == nil || !strings.Contains(err.Error(), k) {
				t.Fatalf("%s=%s: got %v, want an error naming %s", k, v, err, k)
			}
		})
	}
}
