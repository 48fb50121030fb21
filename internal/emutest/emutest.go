// Package emutest gives tests a Firestore or Pub/Sub emulator: the one named
// by FIRESTORE_EMULATOR_HOST / PUBSUB_EMULATOR_HOST (make test starts one of
// each and sets them), or one started on first use and kept for the test
// binary's life. Call Cleanup from TestMain to stop what it started.
package emutest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/emulator"
)

var (
	mu      sync.Mutex
	started = map[emulator.Kind]*emulator.Process{}
	hosts   = map[emulator.Kind]string{}
	errs    = map[emulator.Kind]error{}
)

// Host returns the address of a running emulator of kind, starting one if
// the environment names none. A test that cannot get one fails.
func Host(t testing.TB, kind emulator.Kind) string {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if h, ok := hosts[kind]; ok {
		return h
	}
	if err, ok := errs[kind]; ok {
		t.Fatalf("emutest: no %s emulator: %v", kind, err)
	}
	if h := os.Getenv(kind.EnvHost()); h != "" {
		hosts[kind] = h
		return h
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := emulator.Start(ctx, kind, emulator.Options{})
	if err != nil {
		errs[kind] = err
		t.Fatalf("emutest: no %s emulator: %v", kind, err)
	}
	started[kind] = p
	hosts[kind] = p.Host
	// The client libraries read the address from the environment.
	os.Setenv(kind.EnvHost(), p.Host)
	return p.Host
}

// FirestoreProject points the Firestore client library at the emulator and
// returns a project id unique to this test, so tests sharing one emulator
// never see each other's documents.
func FirestoreProject(t testing.TB) string {
	t.Helper()
	Host(t, emulator.Firestore)
	return UniqueProject(t)
}

// UniqueProject returns a valid, test-unique Google Cloud project id.
func UniqueProject(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + ('a' - 'A')
		}
		return '-'
	}, t.Name())
	if len(name) > 18 {
		name = name[:18]
	}
	return "t-" + strings.Trim(name, "-") + "-" + hex.EncodeToString(b[:])
}

// Cleanup stops the emulators this package started.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	for k, p := range started {
		p.Stop()
		delete(started, k)
	}
}
