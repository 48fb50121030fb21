package instance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/eventually"
	"github.com/relaybus/relaybus/internal/reexec"
)

func TestLazyRetriesAFailedBuildAndBuildsOnce(t *testing.T) {
	builds := 0
	fail := true
	h := Lazy("test", func(context.Context) (http.Handler, error) {
		builds++
		if fail {
			return nil, errors.New("database unreachable")
		}
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }), nil
	})
	serve := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest(http.MethodPost, "/", nil))
		return rec
	}
	if rec := serve(); rec.Code != http.StatusInternalServerError {
		t.Fatalf("failed build: status %d, want 500", rec.Code)
	}
	fail = false
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if rec := serve(); rec.Code != http.StatusTeapot {
				t.Errorf("status %d, want 418", rec.Code)
			}
		}()
	}
	wg.Wait()
	if builds != 2 {
		t.Fatalf("built %d times, want 2 (one failure, then once for every later request)", builds)
	}
}

// closingHandler answers after its delay, tells when a request has entered
// it, and records its Close.
type closingHandler struct {
	delay   time.Duration
	closed  atomic.Bool
	entered chan struct{} // closed when the first request is in the handler
	once    sync.Once
}

func (h *closingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.once.Do(func() { close(h.entered) })
	select {
	case <-time.After(h.delay):
		w.WriteHeader(http.StatusOK)
	case <-r.Context().Done():
	}
}

func (h *closingHandler) Close(context.Context) error {
	h.closed.Store(true)
	return nil
}

func serveSlow(t *testing.T, name string, delay, timeout time.Duration) (url string, h *closingHandler, stop func() time.Duration) {
	t.Helper()
	h = &closingHandler{delay: delay, entered: make(chan struct{})}
	Lazy(name, func(context.Context) (http.Handler, error) { return h, nil })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ServeOptions{Listener: ln, Target: name, ShutdownTimeout: timeout}) }()
	return "http://" + ln.Addr().String(), h, func() time.Duration {
		start := time.Now()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		return time.Since(start)
	}
}

// A shutdown during a slow request lets it finish, then closes what the
// function built.
func TestShutdownFinishesTheRequestInFlight(t *testing.T) {
	url, h, stop := serveSlow(t, "slow", 500*time.Millisecond, 5*time.Second)
	got := make(chan int, 1)
	go func() {
		resp, err := http.Post(url, "application/json", nil)
		if err != nil {
			got <- 0
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	<-h.entered
	took := stop()
	if code := <-got; code != http.StatusOK {
		t.Fatalf("the request in flight got %d, want 200", code)
	}
	if took > 3*time.Second {
		t.Errorf("shutdown took %v", took)
	}
	if !h.closed.Load() {
		t.Error("the built handler was not closed")
	}
	if resp, err := http.Post(url, "application/json", nil); err == nil {
		resp.Body.Close()
		t.Error("a request after shutdown was served")
	}
}

// A request that outlives the shutdown timeout is cut: the process does not
// wait for it.
func TestShutdownCutsWhatOutlivesItsTimeout(t *testing.T) {
	url, h, stop := serveSlow(t, "stuck", time.Minute, 300*time.Millisecond)
	go func() {
		if resp, err := http.Post(url, "application/json", nil); err == nil {
			resp.Body.Close()
		}
	}()
	<-h.entered
	if took := stop(); took > 2*time.Second {
		t.Errorf("shutdown took %v with a 300ms timeout", took)
	}
	if !h.closed.Load() {
		t.Error("the built handler was not closed")
	}
}

// childRole makes the test binary serve the slow "child" function with
// Main (see TestMain).
const childRole = "instance-child"

// childServing is the line the child writes to stderr when a request has
// entered its handler.
const childServing = "relaybus-instance-test: serving"

func TestMain(m *testing.M) {
	if role, _ := reexec.Role(); role == childRole {
		Lazy("child", func(context.Context) (http.Handler, error) {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintln(os.Stderr, childServing)
				time.Sleep(time.Second) // the slow request's work
				w.WriteHeader(http.StatusAccepted)
			}), nil
		})
		Main("child")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// SIGTERM, as Cloud Run sends it, during a slow request: the request
// completes and the process exits 0 within SHUTDOWN_TIMEOUT.
func TestSIGTERMDuringASlowRequest(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), reexec.Env(childRole, ""), "PORT="+strconv.Itoa(port), "SHUTDOWN_TIMEOUT=5s", "FUNCTION_TARGET=")
	watch := &lineWatch{line: childServing, seen: make(chan struct{})}
	cmd.Stderr = watch
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	if !eventually.Within(20*time.Second, func() bool {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		_ = cmd.Process.Kill()
		t.Fatal("the child never listened")
	}
	got := make(chan int, 1)
	go func() {
		resp, err := http.Post(url, "application/json", nil)
		if err != nil {
			got <- 0
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	select {
	case <-watch.seen:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the request never reached the child's handler")
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := <-got; code != http.StatusAccepted {
		t.Errorf("the request in flight at SIGTERM got %d, want 202", code)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("the process exited with %v, want 0", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("exit took %v after SIGTERM, over SHUTDOWN_TIMEOUT", took)
	}
}

// lineWatch passes what the child writes on to the test's stderr and
// closes seen when a whole line equals line. exec.Cmd copies to it from one
// goroutine and Wait waits for that copy.
type lineWatch struct {
	line string
	seen chan struct{}
	buf  []byte
	done bool
}

func (w *lineWatch) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		l := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		if !w.done && l == w.line {
			w.done = true
			close(w.seen)
			continue
		}
		fmt.Fprintln(os.Stderr, l)
	}
	return len(p), nil
}

// A function marked Warm is built when Serve starts, before any request,
// and a failed build is retried until it succeeds; Serve's shutdown closes
// what it built.
func TestWarmBuildsAtStartAndRetries(t *testing.T) {
	var builds atomic.Int32
	built := make(chan struct{})
	closed := make(chan struct{})
	Lazy("warm-test", func(context.Context) (http.Handler, error) {
		if builds.Add(1) == 1 {
			return nil, errors.New("the database is not up yet")
		}
		close(built)
		return closer{closed: closed}, nil
	})
	Warm("warm-test")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, ServeOptions{Listener: ln, Target: "warm-test", ShutdownTimeout: time.Second})
	}()
	select {
	case <-built:
	case <-time.After(10 * time.Second):
		t.Fatalf("not built without a request (%d builds)", builds.Load())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	default:
		t.Fatal("Serve's shutdown did not close the warm-built function")
	}
	if n := builds.Load(); n != 2 {
		t.Errorf("%d builds, want 2 (one failed, one retried)", n)
	}
}

type closer struct{ closed chan struct{} }

func (closer) ServeHTTP(http.ResponseWriter, *http.Request) {}
func (c closer) Close(context.Context) error                { close(c.closed); return nil }
