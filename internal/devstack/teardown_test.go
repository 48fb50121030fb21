package devstack

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/internal/instance"
)

// A start that fails while its services are still starting (the embedded
// NATS server cannot store where it is told to, while the stack's own
// Postgres cluster and Firestore emulator start beside it) leaves nothing
// running: no child process, no listener, no cluster. Before, the broker's
// failure returned at once and the cluster and the emulator, started a
// moment later, ran on with nobody to stop them.
func TestFailedStartWhileServicesStartLeavesNothingRunning(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Postgres cluster and the Firestore emulator")
	}
	state := stateDir(t)
	if err := os.WriteFile(filepath.Join(state, "nats"), []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := Options{Addr: freeAddr(t), StateDir: state, Transport: instance.TransportNATS}
	before := running(t)
	s, err := Start(context.Background(), o)
	if err == nil {
		closeStack(s)
		t.Fatal("Start succeeded with <state>/nats a file")
	}
	if !strings.Contains(err.Error(), "nats") {
		t.Errorf("the error does not name the broker: %v", err)
	}
	assertNothingLeft(t, o, before)
}

// A step that fails after everything has started (the last function's
// configuration is invalid: a bad DLQREPLAY_PUSH_TARGETS) stops all that
// started before it, on either broker: the cluster, the emulator, the
// broker's server, the stack's listener and the functions built so far.
func TestFailedLaterStepLeavesNothingRunning(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Postgres cluster and the Firestore emulator")
	}
	for _, transport := range []string{instance.TransportPubSub, instance.TransportNATS} {
		t.Run(transport, func(t *testing.T) {
			fns := DefaultFunctions()
			fns.DLQReplay.PushTargets = "{"
			o := Options{Addr: freeAddr(t), StateDir: stateDir(t), Transport: transport, Functions: &fns}
			before := running(t)
			s, err := Start(context.Background(), o)
			if err == nil {
				closeStack(s)
				t.Fatal("Start succeeded with DLQREPLAY_PUSH_TARGETS={")
			}
			if !strings.Contains(err.Error(), "dlqreplay: DLQREPLAY_PUSH_TARGETS") {
				t.Errorf("the error does not name the function and the variable: %v", err)
			}
			assertNothingLeft(t, o, before)
		})
	}
}

// stateDir is a state directory the stack's Postgres cluster can live in
// when the test runs as root (the cluster runs as postgres, who cannot
// enter t.TempDir's 0700 directories).
func stateDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "devstack-state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// freeAddr is a 127.0.0.1 address nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// processes is what this process runs: its children's command lines by
// pid, and the TCP ports its own sockets listen on.
type processes struct {
	children  map[int]string
	listening []int
}

// running reads /proc: the processes whose parent is this one, and the
// listening TCP sockets among this process's file descriptors.
func running(t *testing.T) processes {
	t.Helper()
	p := processes{children: map[int]string{}}
	me := os.Getpid()
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces; ppid follows ")".
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(me) {
			cmd, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
			p.children[pid] = strings.ReplaceAll(string(cmd), "\x00", " ")
		}
	}
	inodes := map[string]bool{}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[3] != "0A" || !inodes[fields[9]] {
				continue
			}
			_, port, _ := strings.Cut(fields[1], ":")
			if n, err := strconv.ParseInt(port, 16, 32); err == nil {
				p.listening = append(p.listening, int(n))
			}
		}
		f.Close()
	}
	slices.Sort(p.listening)
	return p
}

// assertNothingLeft fails t if anything the failed Start of o started is
// still there: a child process or a listener of this process that was not
// there before it, a goroutine still starting a server, the stack's
// address taken, its cluster's postmaster.pid.
func assertNothingLeft(t *testing.T, o Options, before processes) {
	t.Helper()
	after := running(t)
	for pid, cmd := range after.children {
		if _, ok := before.children[pid]; !ok {
			t.Errorf("child process %d still runs: %s", pid, cmd)
		}
	}
	for _, port := range after.listening {
		if !slices.Contains(before.listening, port) {
			t.Errorf("this process still listens on port %d", port)
		}
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		t.Errorf("the stack's address %s is still taken: %v", o.Addr, err)
	} else {
		ln.Close()
	}
	// Nothing is still starting either: a server started after Start
	// returned would have nobody to stop it.
	var stacks bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&stacks, 2)
	for _, g := range strings.Split(stacks.String(), "\n\n") {
		for _, starter := range []string{"internal/pgcluster.", "internal/emulator.", "nats-server/v2/server."} {
			if strings.Contains(g, starter) {
				t.Errorf("a goroutine of %s outlived the failed Start:\n%s", starter, g)
				break
			}
		}
	}
	if _, err := os.Stat(filepath.Join(o.StateDir, "postgres", "postmaster.pid")); err == nil {
		t.Errorf("the stack's Postgres cluster still runs: %s exists", filepath.Join(o.StateDir, "postgres", "postmaster.pid"))
	}
}
