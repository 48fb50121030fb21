// Package browsertest gives the console's browser tests their Chromium and
// the directory for their screenshots, from the test environment the way
// emutest and pgtest give tests their emulators and Postgres, so the tests
// themselves read no environment variable.
package browsertest

import (
	"os"
	"os/exec"
	"testing"
)

// Environment variables read here.
const (
	// EnvChromium names a Chromium or Chrome binary to use.
	EnvChromium = "RELAYBUS_CHROMIUM"
	// EnvScreenshots names the directory the browser tests write their
	// screenshots to (docs/console for docs/operations.md: make screenshots).
	EnvScreenshots = "RELAYBUS_SCREENSHOTS"
)

// Chromium finds Debian's Chromium (or another Chrome) the way the suite
// finds Java: named by RELAYBUS_CHROMIUM, or installed on the machine
// (.ci/run installs it when missing). A machine without one fails the
// test: a skipped browser test is a test that did not run.
func Chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(EnvChromium); p != "" {
		return p
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium for the console's browser tests: apt-get install chromium (.ci/run does), or set " + EnvChromium + "; go test -short skips them")
	return ""
}

// Screenshots returns the directory RELAYBUS_SCREENSHOTS names, or the
// test's temporary directory.
func Screenshots(t testing.TB) string {
	if d := os.Getenv(EnvScreenshots); d != "" {
		return d
	}
	return t.TempDir()
}
