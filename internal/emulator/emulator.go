// Package emulator starts the Google Cloud emulators that ship with the gcloud
// SDK (Firestore, Pub/Sub) as child processes on free loopback ports. It runs
// their Java programs directly, not through gcloud's Python wrapper, so that a
// child dies with its parent and Stop leaves nothing behind.
package emulator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/relaybus/relaybus/internal/pgcluster"
)

// Kind names an emulator.
type Kind string

// The emulators relaybus uses.
const (
	Firestore Kind = "firestore"
	PubSub    Kind = "pubsub"
)

// EnvHost returns the environment variable the Google client libraries read
// for kind's address.
func (k Kind) EnvHost() string {
	if k == Firestore {
		return "FIRESTORE_EMULATOR_HOST"
	}
	return "PUBSUB_EMULATOR_HOST"
}

// Errors for missing prerequisites, each saying what to install.
var (
	ErrNoJava      = errors.New("java not found: the gcloud emulators need Java 17 or newer (Debian: apt-get install openjdk-17-jre-headless)")
	ErrNoSDK       = errors.New("gcloud SDK not found: install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install) or set CLOUDSDK_ROOT_DIR")
	ErrNoFirestore = errors.New("the Firestore emulator is not installed: gcloud components install cloud-firestore-emulator (Debian package google-cloud-cli-firestore-emulator), or set FIRESTORE_EMULATOR_HOST to a running one")
	ErrNoPubSub    = errors.New("the Pub/Sub emulator is not installed: gcloud components install pubsub-emulator (Debian package google-cloud-cli-pubsub-emulator), or set PUBSUB_EMULATOR_HOST to a running one")
)

// Options configure Start.
type Options struct {
	// Port on 127.0.0.1; zero picks a free one.
	Port int
	// Log receives the emulator's output; nil keeps the last lines for errors.
	Log io.Writer
}

// Process is a running emulator.
type Process struct {
	Kind Kind
	// Host is host:port, the value for Kind.EnvHost().
	Host string
	cmd  *exec.Cmd
	done chan error
	out  *tail
}

// SDKRoot finds the gcloud SDK: $CLOUDSDK_ROOT_DIR, the usual install paths,
// or the directory above the gcloud on the PATH.
func SDKRoot() (string, error) {
	cands := []string{os.Getenv("CLOUDSDK_ROOT_DIR"), "/usr/lib/google-cloud-sdk", "/usr/share/google-cloud-sdk", "/google-cloud-sdk", "/opt/google-cloud-sdk"}
	if p, err := exec.LookPath("gcloud"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			cands = append(cands, filepath.Dir(filepath.Dir(real)))
		}
	}
	for _, c := range cands {
		if c == "" {
			continue
		}
		if fi, err := os.Stat(filepath.Join(c, "platform")); err == nil && fi.IsDir() {
			return c, nil
		}
	}
	return "", ErrNoSDK
}

// command returns the java command line for kind.
func command(kind Kind, port int) ([]string, error) {
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, ErrNoJava
	}
	root, err := SDKRoot()
	if err != nil {
		return nil, err
	}
	host, p := "--host=127.0.0.1", "--port="+strconv.Itoa(port)
	switch kind {
	case Firestore:
		jar := filepath.Join(root, "platform", "cloud-firestore-emulator", "cloud-firestore-emulator.jar")
		if _, err := os.Stat(jar); err != nil {
			return nil, ErrNoFirestore
		}
		return []string{java, "-Duser.language=en", "-cp", jar, "com.google.cloud.datastore.emulator.firestore.CloudFirestore", "start", host, p, "--database-mode=firestore-native"}, nil
	case PubSub:
		jars, _ := filepath.Glob(filepath.Join(root, "platform", "pubsub-emulator", "lib", "cloud-pubsub-emulator-*.jar"))
		if len(jars) == 0 {
			return nil, ErrNoPubSub
		}
		return []string{java, "-jar", jars[len(jars)-1], host, p}, nil
	}
	return nil, fmt.Errorf("emulator: unknown kind %q", kind)
}

// Check reports a missing prerequisite for kind without starting anything.
func Check(kind Kind) error {
	_, err := command(kind, 1)
	return err
}

// Start launches an emulator and waits until it answers.
func Start(ctx context.Context, kind Kind, opts Options) (*Process, error) {
	port := opts.Port
	if port == 0 {
		var err error
		if port, err = pgcluster.FreePort(); err != nil {
			return nil, err
		}
	}
	argv, err := command(kind, port)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	out := &tail{}
	var w io.Writer = out
	if opts.Log != nil {
		w = io.MultiWriter(out, opts.Log)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s emulator: %w", kind, err)
	}
	p := &Process{Kind: kind, Host: "127.0.0.1:" + strconv.Itoa(port), cmd: cmd, done: make(chan error, 1), out: out}
	go func() { p.done <- cmd.Wait() }()
	if err := p.waitReady(ctx); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

func (p *Process) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(90 * time.Second)
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("%s emulator exited during start-up (%w):\n%s", p.Kind, exited(err), p.out.String())
		default:
		}
		resp, err := client.Get("http://" + p.Host + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s emulator not ready on %s:\n%s", p.Kind, p.Host, p.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Pause stops the emulator's processes (SIGSTOP) without killing them: its
// port still accepts connections but nothing answers, as a Firestore that
// hangs would. Resume lets it go on, with its data.
func (p *Process) Pause() error { return syscall.Kill(-p.cmd.Process.Pid, syscall.SIGSTOP) }

// Resume continues a paused emulator (SIGCONT).
func (p *Process) Resume() error { return syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT) }

// Stop kills the emulator's process group and waits for it.
func (p *Process) Stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// tail keeps the last 8 KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(b)
	if t.buf.Len() > 8192 {
		rest := t.buf.Bytes()[t.buf.Len()-8192:]
		t.buf = *bytes.NewBuffer(append([]byte(nil), rest...))
	}
	return len(b), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(t.buf.String())
}

// exited is a process's exit error, or what an exit without one means.
func exited(err error) error {
	if err == nil {
		return errors.New("exit status 0")
	}
	return err
}
