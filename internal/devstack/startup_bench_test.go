package devstack

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/benchcheck"
)

// BenchmarkStartup times `make dev` as a user sees it on a machine where
// nothing runs: from starting the command to its "ready" line, with a new
// state directory (so a new Postgres cluster is initialized), the Firestore
// emulator started and the command built by go run (its build cache warm,
// as after make test). Then it stops the stack with Ctrl-C (SIGINT) and
// waits for it to exit.
func BenchmarkStartup(b *testing.B) {
	if _, err := exec.LookPath("make"); err != nil {
		b.Fatal("make is not on PATH")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		state, err := os.MkdirTemp("", "relaybus-startup-")
		if err != nil {
			b.Fatal(err)
		}
		_ = os.Chmod(state, 0o755) // the cluster runs as postgres when we are root
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()

		cmd := exec.Command("make", "--no-print-directory", "dev", "DEV_FLAGS=-state "+state+" -addr "+addr)
		cmd.Dir = root
		// Nothing running: the services the test environment started are
		// not the user's.
		cmd.Env = withoutEnv(os.Environ(), "DATABASE_URL", "PUBSUB_EMULATOR_HOST", "FIRESTORE_EMULATOR_HOST", "RELAYBUS_DEV_ADDR")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		ready := make(chan time.Duration, 1)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "relaybus local stack ready") {
					ready <- time.Since(t0)
				}
			}
			close(ready)
		}()
		var took time.Duration
		var ok bool
		select {
		case took, ok = <-ready:
		case <-time.After(5 * time.Minute):
		}
		// Ctrl-C reaches the whole process group, as in a terminal.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		stopped := make(chan error, 1)
		go func() { stopped <- cmd.Wait() }()
		select {
		case <-stopped:
		case <-time.After(time.Minute):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-stopped
		}
		os.RemoveAll(state)
		if !ok {
			b.Fatal("make dev printed no ready line within 5 minutes")
		}
		fmt.Printf("# startup: `make dev` started → its ready line, nothing running before (a new state directory: initdb and a new Postgres cluster, the Firestore emulator's JVM, pstest in the process), go run with a warm build cache\n")
		benchcheck.Figure(b, "startup_s", took.Seconds(), "s")
	}
}

// withoutEnv returns env without the named variables.
func withoutEnv(env []string, names ...string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		drop := false
		for _, n := range names {
			drop = drop || name == n
		}
		if !drop {
			out = append(out, kv)
		}
	}
	return out
}
