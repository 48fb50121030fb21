// Package pgbouncer starts a throwaway PgBouncer in front of a PostgreSQL
// server, in pool_mode = transaction, as Supabase's pooler and most
// serverless set-ups run it: the tests use it to show that relaybus's hot
// paths keep no session state (see internal/pgpool).
//
// Every database of the server is reachable through it under its own name
// (a "*" fallback entry); authentication is trust, for the user of the
// server's URL only. PgBouncer refuses to run as root, so when the caller
// is root it runs as the "postgres" system user.
package pgbouncer

import (
	"context"
	"errors"
	"fmt"
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

	"github.com/relaybus/relaybus/internal/pgcluster"
)

// ErrNoBinary means the pgbouncer program was not found.
var ErrNoBinary = errors.New("pgbouncer not found: install it (Debian: apt-get install pgbouncer) or set PGBOUNCER to its path")

// EnvURL names the variable the test environment sets to PgBouncer's URL
// (connecting as the server URL's user to its database).
const EnvURL = "RELAYBUS_TEST_PGBOUNCER_URL"

// Options configure Start.
type Options struct {
	// ServerURL is the PostgreSQL server behind it (postgres:// URL).
	ServerURL string
	// Dir holds the configuration, the log and the pid file.
	Dir string
	// PoolSize is default_pool_size: server connections per database and
	// user (20).
	PoolSize int
	// ServerLoginRetry is how long PgBouncer waits after a failed server
	// login before it tries again, answering its clients "server login has
	// been failing" meanwhile (server_login_retry; zero keeps PgBouncer's
	// 15 s).
	ServerLoginRetry time.Duration
	// Users, when set, are the users clients may log in as, with their
	// passwords: PgBouncer then authenticates clients with SCRAM-SHA-256
	// and logs into the server as each with its password (the server
	// URL's user is added with the URL's password). Unset: trust, for the
	// server URL's user only.
	Users map[string]string
}

// Bouncer is a running PgBouncer.
type Bouncer struct {
	// URL connects through PgBouncer as the server URL's user to its
	// database, with default_query_exec_mode=exec (see internal/pgpool).
	URL string
	// Port is where it listens, on 127.0.0.1.
	Port int
	// Log is its log file.
	Log  string
	cmd  *exec.Cmd
	done chan error
}

// Binary finds pgbouncer: $PGBOUNCER, the PATH, or /usr/sbin/pgbouncer
// (Debian's package, not on an ordinary user's PATH).
func Binary() (string, error) {
	if p := os.Getenv("PGBOUNCER"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", ErrNoBinary
}

// Start writes a configuration into o.Dir, starts PgBouncer on a free port
// and waits until it passes a query through.
func Start(ctx context.Context, o Options) (*Bouncer, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	server, err := neturl.Parse(o.ServerURL)
	if err != nil || server.Hostname() == "" {
		return nil, fmt.Errorf("pgbouncer: ServerURL must be a postgres:// URL with a host")
	}
	if o.PoolSize <= 0 {
		o.PoolSize = 20
	}
	if o.ServerLoginRetry <= 0 {
		o.ServerLoginRetry = 15 * time.Second
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := pgcluster.FreePort()
	if err != nil {
		return nil, err
	}
	userName := server.User.Username()
	if userName == "" {
		userName = "postgres"
	}
	serverPort := server.Port()
	if serverPort == "" {
		serverPort = "5432"
	}
	b := &Bouncer{Port: port, Log: filepath.Join(dir, "pgbouncer.log"), done: make(chan error, 1)}
	authType, userList := "trust", fmt.Sprintf("%q %q\n", userName, "")
	if o.Users != nil {
		pw, _ := server.User.Password()
		users := map[string]string{userName: pw}
		for u, p := range o.Users {
			users[u] = p
		}
		names := make([]string, 0, len(users))
		for u := range users {
			names = append(names, u)
		}
		sort.Strings(names)
		authType, userList = "scram-sha-256", ""
		for _, u := range names {
			userList += fmt.Sprintf("%q %q\n", u, users[u])
		}
	}
	ini := strings.Join([]string{
		"[databases]",
		fmt.Sprintf("* = host=%s port=%s", server.Hostname(), serverPort),
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		"listen_port = " + strconv.Itoa(port),
		"unix_socket_dir =",
		"auth_type = " + authType,
		"auth_file = " + filepath.Join(dir, "userlist.txt"),
		"admin_users = " + userName,
		"pool_mode = transaction",
		"default_pool_size = " + strconv.Itoa(o.PoolSize),
		"max_client_conn = 2000",
		"server_login_retry = " + strconv.Itoa(max(1, int(o.ServerLoginRetry.Seconds()))),
		"logfile = " + b.Log,
		"pidfile = " + filepath.Join(dir, "pgbouncer.pid"),
		// What pgx never sends but other clients (psql's libpq, JDBC) do.
		"ignore_startup_parameters = extra_float_digits",
		"",
	}, "\n")
	files := map[string]string{"pgbouncer.ini": ini, "userlist.txt": userList}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgbouncer: hand %s to the postgres user: %w", dir, err)
		}
	}
	// Not CommandContext: PgBouncer outlives the start-up context.
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	b.cmd = cmd
	go func() { b.done <- cmd.Wait() }()
	u := *server
	u.Host = "127.0.0.1:" + strconv.Itoa(port)
	q := u.Query()
	q.Set("default_query_exec_mode", "exec")
	u.RawQuery = q.Encode()
	b.URL = u.String()
	if err := b.waitReady(ctx); err != nil {
		_ = b.Stop(context.Background())
		log, _ := os.ReadFile(b.Log)
		return nil, fmt.Errorf("%w\n%s", err, strings.TrimSpace(string(log)))
	}
	return b, nil
}

func (b *Bouncer) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-b.done:
			b.done <- err
			if err == nil {
				err = errors.New("exit status 0")
			}
			return fmt.Errorf("pgbouncer: exited during start-up: %w", err)
		default:
		}
		conn, err := pgx.Connect(ctx, b.URL)
		if err == nil {
			_, err = conn.Exec(ctx, "SELECT 1")
			conn.Close(ctx)
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("pgbouncer: not ready on port %d: %w", b.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop shuts PgBouncer down (SIGINT: at once) and waits for it to exit, or
// kills it when ctx ends first.
func (b *Bouncer) Stop(ctx context.Context) error {
	if b == nil || b.cmd == nil || b.cmd.Process == nil {
		return nil
	}
	_ = b.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-b.done:
		return nil
	case <-ctx.Done():
		_ = b.cmd.Process.Kill()
		<-b.done
		return ctx.Err()
	}
}

// credential returns the postgres user's credential when running as root
// (PgBouncer refuses root), nil otherwise.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("pgbouncer: running as root and there is no \"postgres\" user to run PgBouncer as (it refuses root)")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
