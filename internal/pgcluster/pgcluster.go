// Package pgcluster starts a throwaway PostgreSQL cluster from the installed
// server binaries: initdb into a data directory, then postgres in the
// foreground as a child process on a free loopback port. PostgreSQL refuses to
// run as root, so when the caller is root the cluster runs as the "postgres"
// system user. The local stack (make dev) and the tests use it when no
// DATABASE_URL is given.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoBinaries means no PostgreSQL server binaries were found.
var ErrNoBinaries = errors.New("PostgreSQL server binaries (initdb, postgres) not found: install PostgreSQL 15 or newer (Debian: apt-get install postgresql), or set DATABASE_URL to a running server")

// Options configure Start.
type Options struct {
	// DataDir holds the cluster. It is created (initdb) when empty and reused
	// when it already holds a cluster.
	DataDir string
	// Port to listen on, on 127.0.0.1. Zero picks a free port.
	Port int
	// Durable keeps fsync and synchronous commit on. Off by default: the
	// cluster is throwaway and tests should not wait on disks.
	Durable bool
	// Settings are extra postgres -c settings. Without max_connections
	// the server keeps PostgreSQL's default, 100, as a user's would.
	Settings map[string]string
	// Log receives the server's output; nil discards it.
	Log *os.File
	// Password, when set, is the superuser's password, and TCP
	// connections authenticate with SCRAM-SHA-256 (as a managed Postgres
	// does) instead of trust; the Unix socket stays trusted. URL carries
	// it.
	Password string
}

// Cluster is a running throwaway cluster.
type Cluster struct {
	// URL connects as the superuser "postgres" to database "postgres".
	URL     string
	Port    int
	DataDir string
	cmd     *exec.Cmd
	done    chan error
}

// BinDir finds the directory holding initdb and postgres: $PG_BINDIR, the
// newest /usr/lib/postgresql/<v>/bin, or the PATH.
func BinDir() (string, error) {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		if hasServer(d) {
			return d, nil
		}
		return "", fmt.Errorf("PG_BINDIR=%s holds no initdb and postgres: %w", d, ErrNoBinaries)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if hasServer(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && hasServer(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", ErrNoBinaries
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func hasServer(dir string) bool {
	for _, b := range []string{"initdb", "postgres"} {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() {
			return false
		}
	}
	return true
}

// FreePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start initializes (if needed) and starts a cluster, and waits until it
// accepts connections.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	if opts.DataDir == "" {
		return nil, errors.New("pgcluster: DataDir is required")
	}
	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if cred != nil {
		if err := os.Chown(dataDir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgcluster: hand %s to the postgres user: %w", dataDir, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, "PG_VERSION")); err != nil {
		args := []string{"-D", dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"}
		if opts.Password != "" {
			// A throwaway cluster's password, readable by initdb's user.
			f, err := os.CreateTemp("", "pgcluster-pw-*")
			if err != nil {
				return nil, fmt.Errorf("pgcluster: %w", err)
			}
			defer os.Remove(f.Name())
			_, err = f.WriteString(opts.Password + "\n")
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = os.Chmod(f.Name(), 0o644)
			}
			if err != nil {
				return nil, fmt.Errorf("pgcluster: %w", err)
			}
			args = append(args, "--auth-host=scram-sha-256", "--pwfile="+f.Name())
		}
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		cmd.Dir = "/"
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("pgcluster: initdb: %w\n%s", err, out)
		}
	}
	port := opts.Port
	if port == 0 {
		if port, err = FreePort(); err != nil {
			return nil, err
		}
	} else if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		return nil, fmt.Errorf("pgcluster: port %d is in use: %w", port, err)
	} else {
		l.Close()
	}
	args := []string{"-D", dataDir, "-p", strconv.Itoa(port), "-k", dataDir,
		"-c", "listen_addresses=127.0.0.1"}
	if !opts.Durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	// Commit times of rows (pg_xact_commit_timestamp) let make load and the
	// benchmarks end a consumer's latency at its commit, not at a now()
	// taken when its transaction began.
	// pg_stat_statements, for the benchmarks' statement counts and profiles
	// (and anyone profiling make dev); Settings may override it.
	args = append(args, "-c", "track_commit_timestamp=on", "-c", "shared_preload_libraries=pg_stat_statements")
	keys := make([]string, 0, len(opts.Settings))
	for k := range opts.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+opts.Settings[k])
	}
	// Not CommandContext: the cluster outlives the start-up context.
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.Dir = "/"
	// Pdeathsig stops the server if this process dies without calling Stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	var logBuf bytes.Buffer
	if opts.Log != nil {
		cmd.Stdout, cmd.Stderr = opts.Log, opts.Log
	} else {
		cmd.Stdout, cmd.Stderr = &logBuf, &logBuf
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	c := &Cluster{
		URL:     fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
		Port:    port,
		DataDir: dataDir,
		cmd:     cmd,
		done:    make(chan error, 1),
	}
	if opts.Password != "" {
		c.URL = fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable", neturl.QueryEscape(opts.Password), port)
	}
	go func() { c.done <- cmd.Wait() }()
	if err := c.waitReady(ctx); err != nil {
		_ = c.Stop(context.Background())
		return nil, fmt.Errorf("%w\n%s", err, strings.TrimSpace(logBuf.String()))
	}
	return c, nil
}

func (c *Cluster) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-c.done:
			c.done <- err
			if err == nil {
				err = errors.New("exit status 0")
			}
			return fmt.Errorf("pgcluster: postgres exited during start-up: %w", err)
		default:
		}
		conn, err := pgx.Connect(ctx, c.URL)
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("pgcluster: postgres not ready on port %d: %w", c.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop shuts the cluster down (fast shutdown: open transactions are rolled
// back) and waits for it to exit, or kills it when ctx ends first.
func (c *Cluster) Stop(ctx context.Context) error {
	if c == nil || c.cmd.Process == nil {
		return nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		_ = c.cmd.Process.Kill()
		<-c.done
		return ctx.Err()
	}
}

// StopImmediate stops the cluster as pg_ctl stop -m immediate does
// (SIGQUIT: every connection cut, no shutdown checkpoint, crash recovery at
// the next start) and waits for it to exit, or kills it when ctx ends first.
func (c *Cluster) StopImmediate(ctx context.Context) error {
	if c == nil || c.cmd.Process == nil {
		return nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		_ = c.cmd.Process.Kill()
		<-c.done
		return ctx.Err()
	}
}

// CreateDatabase creates database name if it does not exist and returns its URL.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) (string, error) {
	return CreateDatabase(ctx, c.URL, name)
}

// CreateDatabase creates database name on the server at url if it does not
// exist (another client creating it meanwhile included), and returns url
// with the database replaced.
func CreateDatabase(ctx context.Context, url, name string) (string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		return "", err
	}
	if !exists {
		if _, err := conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
			var pg *pgconn.PgError
			if !errors.As(err, &pg) || pg.Code != "42P04" { // duplicate_database: created meanwhile
				return "", fmt.Errorf("create database %s: %w", name, err)
			}
		}
	}
	u, err := neturl.Parse(url)
	if err != nil {
		return "", fmt.Errorf("database URL: %w", err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// serverCredential returns the postgres user's credential when running as
// root (PostgreSQL refuses root), nil otherwise.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("pgcluster: running as root and there is no \"postgres\" user to run the server as (PostgreSQL refuses root): create one (useradd postgres) or run as another user")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// Durability reads how the server at url commits: its fsync,
// synchronous_commit and full_page_writes settings, as "fsync=on
// synchronous_commit=on full_page_writes=on", and whether all three are on,
// as production runs (and as every benchmark figure requires:
// docs/benchmarks.md).
func Durability(ctx context.Context, url string) (settings string, durable bool, err error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", false, fmt.Errorf("durability: %w", err)
	}
	defer conn.Close(ctx)
	var fsync, sync, fpw string
	if err := conn.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit'),
		current_setting('full_page_writes')`).Scan(&fsync, &sync, &fpw); err != nil {
		return "", false, fmt.Errorf("durability: %w", err)
	}
	settings = fmt.Sprintf("fsync=%s synchronous_commit=%s full_page_writes=%s", fsync, sync, fpw)
	return settings, fsync == "on" && sync == "on" && fpw == "on", nil
}
