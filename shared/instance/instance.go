// Package instance is what every relaybus function does the same way on
// Cloud Run: build its dependencies once per instance from the environment
// (lazily, on the first request, so a cold start that cannot reach a
// dependency answers 500 and the next request tries again), read the
// settings every function shares, and serve with functions-framework-go.
//
// A function package registers itself in init():
//
//	func init() {
//		functions.HTTP("relay", instance.Lazy("relay", fromEnv))
//	}
//
// and its command is one line:
//
//	func main() { instance.Main("relay") }
package instance

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/shared/logging"
	"github.com/relaybus/relaybus/shared/migrate"
)

// Env holds the settings every function reads (github.com/sethvargo/go-envconfig
// tags). Embed it in a function's own Config.
type Env struct {
	// ProjectID is the Google Cloud project (GOOGLE_CLOUD_PROJECT).
	ProjectID string `env:"GOOGLE_CLOUD_PROJECT"`
	// LogLevel is debug, info, warn or error (LOG_LEVEL, default info).
	LogLevel string `env:"LOG_LEVEL, default=info"`
	// Topology is the topology file's path (RELAYBUS_TOPOLOGY; empty means
	// topology.Load's own search).
	Topology string `env:"RELAYBUS_TOPOLOGY"`
}

// Logger returns the function's JSON logger on stderr at the configured
// level, with Cloud Logging's trace correlation for the project.
func (e Env) Logger() *slog.Logger {
	return logging.New(os.Stderr, logging.Options{Level: logging.ParseLevel(e.LogLevel), ProjectID: e.ProjectID})
}

// Lazy returns an HTTP handler that builds the real handler with build on
// first use and serves every request with it. A failed build is not kept:
// it is logged, the request answers 500, and the next request builds again.
// The 500's body does not carry the error: a failed start's error names the
// database host, user and socket path, which belong in the logs only.
// The context given to build is the first request's without its
// cancellation, since the clients it creates outlive that request.
func Lazy(name string, build func(ctx context.Context) (http.Handler, error)) http.HandlerFunc {
	var (
		mu sync.Mutex
		h  http.Handler
	)
	get := func(ctx context.Context) (http.Handler, error) {
		mu.Lock()
		defer mu.Unlock()
		if h != nil {
			return h, nil
		}
		built, err := build(context.WithoutCancel(ctx))
		if err != nil {
			return nil, err
		}
		h = built
		return h, nil
	}
	return func(w http.ResponseWriter, r *http.Request) {
		handler, err := get(r.Context())
		if err != nil {
			logging.New(os.Stderr, logging.Options{}).ErrorContext(r.Context(), name+": cannot start", "error", err.Error())
			http.Error(w, name+": cannot start; the reason is in the function's logs", http.StatusInternalServerError)
			return
		}
		handler.ServeHTTP(w, r)
	}
}

// Postgres opens a connection pool to url (DATABASE_URL), checks that the
// database answers within 10 seconds and applies the given migration lines
// (each idempotent), so an instance never serves against missing tables.
func Postgres(ctx context.Context, url string, lines ...migrate.Line) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, fmt.Errorf("DATABASE_URL is not set")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	for _, l := range lines {
		if _, err := l.Apply(ctx, pool); err != nil {
			pool.Close()
			return nil, err
		}
	}
	return pool, nil
}

// Main serves the function registered as target with functions-framework-go
// on $PORT (8080). FUNCTION_TARGET defaults to target, so the function
// answers at "/" and every path below it. It exits 1 when serving fails.
func Main(target string) {
	if os.Getenv("FUNCTION_TARGET") == "" {
		os.Setenv("FUNCTION_TARGET", target)
	}
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	if err := funcframework.Start(port); err != nil {
		fmt.Fprintln(os.Stderr, target+":", err)
		os.Exit(1)
	}
}
