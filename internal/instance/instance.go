// Package instance is what every relaybus function does the same way on
// Cloud Run: read its configuration from the environment (config.go, the
// one reader of the environment, and the settings every function shares:
// Env, PubSub, Ledger, Recorder), build itself once per instance (lazily,
// on the first request, so a cold start that cannot reach a dependency
// answers 500 and the next request tries again), and serve, shutting down
// gracefully.
//
// A function package declares one Config and one constructor,
// Build(ctx, Config), and registers the production path in init():
//
//	func init() {
//		functions.HTTP("relay", instance.Lazy("relay", instance.FromEnv(LoadConfig, Build)))
//	}
//
// The local stack and the tests call the same Build with a Config of
// their own (from Defaults), so they run what ships.
//
// and its command is one line:
//
//	func main() { instance.Main("relay") }
//
// Main serves the function with its own http.Server rather than
// funcframework.Start (a bare ListenAndServe): on SIGTERM, which Cloud Run
// sends before it stops an instance (then SIGKILL 10 s later), it stops
// accepting, lets the requests in flight finish within SHUTDOWN_TIMEOUT
// (8 s), closes what the function built (a built handler with a
// Close(context.Context) error method: ledger writes still queued are
// flushed, clients closed) and logs what it cut, if anything. The
// registration with functions-framework-go stays, so the function also
// runs under the framework's own main (without the graceful shutdown).
//
// The package opens no backend. Each backend has an opener package of its
// own, and a function's Build imports only those its configuration names,
// so its binary links only what it can use: pgopen (Postgres pools and
// migrations), fsopen (the Firestore ledger, and clients on other
// Firestore databases) and brokeropen (Pub/Sub or NATS JetStream, as
// TRANSPORT names; natsopen for NATS alone). rollup, which Pub/Sub pushes
// its notices to over HTTP, which pulls them on NATS, and which writes only
// Firestore, links neither pgx nor a Pub/Sub client.
package instance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/relaybus/relaybus/internal/logging"
	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/retry"
)

// Lazy returns an HTTP handler that builds the real handler with build on
// first use and serves every request with it. A failed build is not kept:
// it is logged, the request answers 500, and the next request builds again.
// The context given to build is the first request's without its
// cancellation, since the clients it creates outlive that request.
//
// The handler is also registered for Main under name; if it has a
// Close(context.Context) error method, Main calls it at shutdown. The 500
// says only that the function cannot start (the cause, which may name a
// database host or user, goes to the log).
func Lazy(name string, build func(ctx context.Context) (http.Handler, error)) http.HandlerFunc {
	l := &lazy{name: name, build: build}
	registry.Lock()
	registry.fns[name] = l
	registry.Unlock()
	return l.ServeHTTP
}

// Closer is a built handler with something to flush or close at shutdown.
type Closer interface {
	Close(ctx context.Context) error
}

// Warm has Serve build the function registered as name as soon as it
// starts, retrying with backoff until the build succeeds, rather than on
// its first request: for a function with work of its own besides
// requests (consume's pull mode). Call it after Lazy.
func Warm(name string) {
	registry.Lock()
	defer registry.Unlock()
	if l, ok := registry.fns[name]; ok {
		l.warm = true
	}
}

// warmBackoff spaces a warm function's builds: 1 s doubling to 30 s,
// ±20% jitter (retry.Policy), until one succeeds.
var warmBackoff = retry.Policy{Initial: time.Second, Max: 30 * time.Second}

// warmUp builds l until it succeeds or ctx ends.
func (l *lazy) warmUp(ctx context.Context, log *slog.Logger) {
	bo := warmBackoff.Backoff()
	for {
		_, err := l.get(ctx)
		if err == nil {
			return
		}
		wait := bo.Next()
		log.ErrorContext(ctx, l.name+": cannot start; retrying", "error", err.Error(), "retry_in", wait.String())
		if retry.Sleep(ctx, wait) != nil {
			return
		}
	}
}

type lazy struct {
	warm  bool
	name  string
	build func(ctx context.Context) (http.Handler, error)
	mu    sync.Mutex
	h     http.Handler
}

func (l *lazy) get(ctx context.Context) (http.Handler, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h != nil {
		return l.h, nil
	}
	built, err := l.build(context.WithoutCancel(ctx))
	if err != nil {
		return nil, err
	}
	l.h = built
	return l.h, nil
}

func (l *lazy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	handler, err := l.get(r.Context())
	if err != nil {
		logging.New(os.Stderr, logging.Options{}).ErrorContext(r.Context(), l.name+": cannot start", "error", err.Error())
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error":"unavailable","message":"` + l.name + ` cannot start; see its logs"}` + "\n"))
		return
	}
	handler.ServeHTTP(w, r)
}

// close closes the built handler, if it was built and can be closed.
func (l *lazy) close(ctx context.Context) error {
	l.mu.Lock()
	h := l.h
	l.mu.Unlock()
	if c, ok := h.(Closer); ok {
		return c.Close(ctx)
	}
	return nil
}

// registry holds every function Lazy made, by name, for Main.
var registry = struct {
	sync.Mutex
	fns map[string]*lazy
}{fns: map[string]*lazy{}}

// DefaultShutdownTimeout bounds a graceful shutdown: below Cloud Run's
// 10 s between SIGTERM and SIGKILL.
const DefaultShutdownTimeout = 8 * time.Second

// Main serves the function registered as target (FUNCTION_TARGET overrides
// it) on $PORT (8080), at "/" and every path below it, until SIGTERM or
// SIGINT, then shuts down gracefully within SHUTDOWN_TIMEOUT (see the
// package documentation). It exits 1 when serving fails.
func Main(target string) {
	h, err := Load[host](context.Background())
	if err == nil && h.ShutdownTimeout <= 0 {
		err = fmt.Errorf("SHUTDOWN_TIMEOUT=%s: want a positive duration such as 8s", h.ShutdownTimeout)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", target, err)
		os.Exit(1)
	}
	if h.Target != "" {
		target = h.Target
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := logging.New(os.Stderr, logging.Options{ProjectID: h.ProjectID})
	if err := Serve(ctx, ServeOptions{Addr: ":" + h.Port, Target: target, ShutdownTimeout: h.ShutdownTimeout, Logger: log}); err != nil {
		fmt.Fprintln(os.Stderr, target+":", err)
		os.Exit(1)
	}
}

// ServeOptions configure Serve.
type ServeOptions struct {
	// Addr is where to listen (":8080"); Listener, when set, is used instead.
	Addr     string
	Listener net.Listener
	// Target names the function (as registered by Lazy).
	Target string
	// ShutdownTimeout bounds the shutdown (DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// Logger receives the shutdown's report (logging.Discard when nil).
	Logger *slog.Logger
}

// Serve serves the function registered as o.Target until ctx ends, then
// shuts down: it stops accepting, waits for the requests in flight until
// o.ShutdownTimeout, cuts those still running, closes what the function
// built with the time left (at least a second), and logs what it cut. It
// returns nil after a shutdown and the error when serving failed.
func Serve(ctx context.Context, o ServeOptions) error {
	registry.Lock()
	fn, ok := registry.fns[o.Target]
	registry.Unlock()
	if !ok {
		return fmt.Errorf("no function registered as %q", o.Target)
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	if o.Logger == nil {
		o.Logger = logging.Discard()
	}
	ln := o.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", o.Addr); err != nil {
			return err
		}
	}
	var inFlight atomic.Int64
	srv := &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inFlight.Add(1)
			defer inFlight.Add(-1)
			fn.ServeHTTP(w, r)
		}),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if fn.warm {
		go fn.warmUp(ctx, o.Logger)
	}
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	start := time.Now()
	sctx, cancel := context.WithTimeout(context.Background(), o.ShutdownTimeout)
	defer cancel()
	o.Logger.Info(o.Target+": shutting down", "in_flight", inFlight.Load(), "timeout", o.ShutdownTimeout.String())
	cut := int64(0)
	if err := srv.Shutdown(sctx); err != nil {
		cut = inFlight.Load()
		_ = srv.Close()
	}
	cctx, ccancel := context.WithTimeout(context.Background(), max(time.Until(start.Add(o.ShutdownTimeout)), time.Second))
	defer ccancel()
	// The last request has been answered and the pools are still open:
	// export what telemetry holds now, the gauges that read the pools
	// included, so an instance that lived less than the metric interval
	// (Cloud Run scaling to zero) still exports its metrics. The
	// function's own close then flushes what its shutdown records.
	flushErr := otelsetup.ForceFlush(cctx)
	closeErr := errors.Join(fn.close(cctx), flushErr)
	level := slog.LevelInfo
	if cut > 0 || closeErr != nil {
		level = slog.LevelWarn
	}
	o.Logger.Log(context.Background(), level, o.Target+": shut down", "requests_cut", cut,
		"close_error", errText(closeErr), "took_ms", time.Since(start).Milliseconds())
	return nil
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
