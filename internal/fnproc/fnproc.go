// Package fnproc runs a relaybus function in a process of its own for a
// benchmark, wired exactly as production wires it (instance.Main: the
// function's configuration read from the environment, its one
// constructor, the graceful shutdown), so the benchmark can read that
// process's own CPU time apart from the load generator's.
//
// The process is the test binary itself, started again: a test package
// whose TestMain calls Serve first becomes the function when Start set
// its variable, and runs its tests otherwise.
//
// To see where the function spends its CPU, name a file in
// RELAYBUS_FNPROC_CPUPROFILE (and RELAYBUS_FNPROC_MEMPROFILE for its
// allocations) when running a benchmark; the function's process, which
// inherits the environment, writes its profile there when it exits
// (go tool pprof -top <file>). With several functions in one run, the
// last to exit wins.
package fnproc

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/cost"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/reexec"
)

// role is the reexec role of a test binary started again as a function
// (its argument: the function's target).
const role = "function"

// Env returns the environment entry that makes a test binary whose
// TestMain calls Serve serve the function registered as target, for a
// test that starts and watches that process itself.
func Env(target string) string { return reexec.Env(role, target) }

// Profiles the function's process writes, when named (see the package
// documentation).
const (
	EnvCPUProfile = "RELAYBUS_FNPROC_CPUPROFILE"
	EnvMemProfile = "RELAYBUS_FNPROC_MEMPROFILE"
)

// Serve makes this process the function Start asked for, if it did: it
// serves it (instance.Main) and exits. Otherwise it returns at once. Call
// it first in TestMain.
func Serve() {
	r, target := reexec.Role()
	if r != role || target == "" {
		return
	}
	stop := startProfiles(target, os.Getenv(EnvCPUProfile), os.Getenv(EnvMemProfile))
	instance.Main(target)
	stop()
	os.Exit(0)
}

// startProfiles starts a CPU profile into cpuPath and returns the function
// that stops it and writes the allocation profile into memPath (either
// path empty: that profile is not taken). A profile that cannot be taken
// is said on stderr (the function's log) and the function serves anyway.
func startProfiles(target, cpuPath, memPath string) func() {
	var cpu *os.File
	if cpuPath != "" {
		f, err := os.Create(cpuPath)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "fnproc: %s: no CPU profile: %v\n", target, err)
		} else {
			cpu = f
		}
	}
	return func() {
		if cpu != nil {
			pprof.StopCPUProfile()
			cpu.Close()
		}
		if memPath == "" {
			return
		}
		f, err := os.Create(memPath)
		if err == nil {
			runtime.GC()
			err = pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "fnproc: %s: no allocation profile: %v\n", target, err)
		}
	}
}

// Proc is a function serving in a process of its own.
type Proc struct {
	// URL is where it serves (http://127.0.0.1:<port>).
	URL string
	cmd *exec.Cmd
}

// Start starts the test binary again as the function registered as target
// (its package must be linked into the test binary, and its TestMain must
// call Serve), with env added to this process's environment (the
// function's configuration: DATABASE_URL, PUBSUB_EMULATOR_HOST, ...) and
// PORT set to a free port. It waits until the function answers HTTP, and
// stops it when the benchmark ends.
func Start(tb testing.TB, target string, env map[string]string) *Proc {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), Env(target), "PORT="+strconv.Itoa(port))
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	// Its log goes to a file, which the benchmark's log shows when it fails.
	logPath := filepath.Join(tb.TempDir(), target+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &Proc{URL: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd}
	tb.Cleanup(func() {
		_ = p.Stop()
		logFile.Close()
		if tb.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				tb.Logf("%s's log (last 4 KB):\n%s", target, b[max(0, len(b)-4096):])
			}
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
			c.Close()
			return p
		}
		if time.Now().After(deadline) {
			tb.Fatalf("fnproc: %s did not listen on port %d within a minute", target, port)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CPU returns the user plus system CPU time the function's process has
// used so far.
func (p *Proc) CPU() (time.Duration, error) { return cost.ProcessCPU(p.cmd.Process.Pid) }

// Stop sends SIGTERM, as Cloud Run does, and waits for the process to
// exit (killing it after 30 s).
func (p *Proc) Stop() error {
	if p.cmd.ProcessState != nil {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		return <-done
	}
}

// StopCPU stops the function gracefully (Stop) and returns the user plus
// system CPU time its process used in all, from its rusage at exit, which
// counts the shutdown's work (flushing what was buffered) too.
func (p *Proc) StopCPU() (time.Duration, error) {
	if err := p.Stop(); err != nil {
		return 0, fmt.Errorf("fnproc: the function exited with %w", err)
	}
	st := p.cmd.ProcessState
	return st.UserTime() + st.SystemTime(), nil
}

// Warm sends GET / until the function answers (a lazily built function
// builds itself on its first request), within a minute.
func (p *Proc) Warm(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(p.URL + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("fnproc: %s does not answer: %w", p.URL, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
