package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The fuzz targets of the module are found where they are: those of
// internal/cloudevent, shared/event, internal/delivery and internal/ledger/query at least (the
// Makefile named FuzzPageToken in internal/ledger after it moved, and go test
// fuzzed nothing).
func TestDiscoverFindsTheModulesTargets(t *testing.T) {
	got, err := discover("../../..")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tg := range got {
		names = append(names, strings.TrimPrefix(tg.String(), "./../../../"))
	}
	for _, want := range []string{"internal/cloudevent.FuzzDecode", "shared/event.FuzzEnvelopeJSON", "internal/delivery.FuzzRead", "internal/ledger/query.FuzzPageToken"} {
		if !slices.Contains(names, want) {
			t.Errorf("discovered %v; %s is missing", names, want)
		}
	}
}

func TestDiscoverReadsOnlyFuzzFunctions(t *testing.T) {
	dir := t.TempDir()
	src := `package p

import "testing"

func FuzzThing(f *testing.F)     {}
func Fuzzy(f *testing.F)         {} // not a fuzz target: a lower-case letter follows Fuzz
func FuzzHelper(t *testing.T)    {} // not one: takes a *testing.T
func TestThing(t *testing.T)     {}
`
	if err := os.MkdirAll(filepath.Join(dir, "p", "testdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "p", "p_test.go"), filepath.Join(dir, "p", "testdata", "x_test.go")} {
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := discover(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].name != "FuzzThing" {
		t.Fatalf("discovered %v, want FuzzThing only (testdata skipped)", got)
	}
}

// A target go test does not find fails, where go test -fuzz itself
// passes.
func TestFuzzFailsOnATargetThatDoesNotExist(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a package's tests")
	}
	err := fuzz(context.Background(), target{dir: "../../../internal/names", name: "FuzzNoSuchTarget"}, time.Second, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "no such fuzz target") {
		t.Fatalf("fuzz of a missing target: %v, want it refused", err)
	}
}
