package main

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/functions/publish"
	"github.com/relaybus/relaybus/internal/instance"
)

// The functions' variables make dev honours reach the stack as the
// functions read them.
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
	} {
		t.Setenv(k, v)
	}
	cfg, err := instance.Load[config](context.Background())
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.options()
	got := []string{o.DatabaseURL, o.PubSubHost, o.FirestoreHost, o.Topology, o.Transport, o.NATSURL, cfg.Env.ProjectID, o.ForwardSigningSecret}
	want := []string{"postgres://u@db.example:5432/main", "127.0.0.1:8085", "127.0.0.1:8086", "/tmp/topology.yaml", "nats", "nats://127.0.0.1:4222", "other-project",
		"whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("options from the environment:\n got %q\nwant %q", got, want)
	}
	if !o.Logger.Enabled(context.Background(), slog.LevelDebug) {
		t.Error("LOG_LEVEL=debug: the stack's logger drops debug")
	}
}

// Unset, LOG_LEVEL and TRANSPORT have the functions' defaults: make dev
// logs at what production logs at, not a default of its own.
func TestConfigDefaultsAreTheFunctions(t *testing.T) {
	for _, k := range []string{"LOG_LEVEL", "TRANSPORT"} {
		t.Setenv(k, "") // restored afterwards
		if err := os.Unsetenv(k); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := instance.Load[config](context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fn := instance.Defaults[publish.Config]()
	if cfg.Env.LogLevel != fn.LogLevel || cfg.PubSub.Transport != fn.PubSub.Transport {
		t.Errorf("make dev's LOG_LEVEL %q and TRANSPORT %q, the functions' %q and %q", cfg.Env.LogLevel, cfg.PubSub.Transport, fn.LogLevel, fn.PubSub.Transport)
	}
	ctx := context.Background()
	if l := cfg.options().Logger; !l.Enabled(ctx, slog.LevelInfo) || l.Enabled(ctx, slog.LevelDebug) {
		t.Errorf("unset LOG_LEVEL: the stack's logger does not log at info")
	}
}

// An invalid value is an error naming the variable, as the functions'.
func TestConfigNamesAnInvalidVariable(t *testing.T) {
	t.Setenv("SHUTDOWN_TIMEOUT", "often")
	_, err := instance.Load[config](context.Background())
	if err == nil || !strings.Contains(err.Error(), "SHUTDOWN_TIMEOUT") {
		t.Fatalf("got %v, want an error naming SHUTDOWN_TIMEOUT", err)
	}
}
