// Command relaybus is the operators' command line over the dlqreplay API:
// events, traces, dead letters, replays, re-pushes, seeks and the consumer
// registry. `relaybus --help` lists every command; `relaybus <command>
// --help` describes one.
//
// Global flags come before the command, a command's flags before its
// arguments: --api or --url (default $RELAYBUS_API or
// http://127.0.0.1:8080/dlqreplay), --token (DLQREPLAY_AUTH=token's static
// token, sent in X-Relaybus-Token; default $RELAYBUS_TOKEN), --gcloud-auth
// (an ID token from `gcloud auth print-identity-token` for the API's
// service URL, sent as Authorization: Bearer, for dlqreplay on Cloud Run),
// -o table|json.
//
// A token (--token or --gcloud-auth) goes only to the API it names: --api
// must then be https (http:// only for a loopback address, as `make dev`'s
// is), and a redirect to another scheme or host is refused, not followed,
// so neither the token nor X-Relaybus-Token reaches an address the user
// did not give.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"time"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, http.DefaultClient))
}

// cli is one invocation's settings.
type cli struct {
	api, token, idToken, output string
	http                        *http.Client
	out                         io.Writer
}

// usageError is a command line mistake: exit code 2.
type usageError string

func (u usageError) Error() string { return string(u) }

// command is one relaybus command.
type command struct {
	// path is the command's words ("events", "ls").
	path []string
	// args describes its arguments, short what it does in a line.
	args, short string
	// setup registers its flags and returns what runs it.
	setup func(fs *flag.FlagSet) func(ctx context.Context, c *cli, args []string) error
}

func (c *command) name() string { return strings.Join(c.path, " ") }

// flagSet is a command's flags, their help written to out.
func (c *command) flagSet(out io.Writer) (*flag.FlagSet, func(ctx context.Context, cl *cli, args []string) error) {
	fs := flag.NewFlagSet("relaybus "+c.name(), flag.ContinueOnError)
	fs.SetOutput(out)
	run := c.setup(fs)
	fs.Usage = func() {
		fmt.Fprintf(out, "%s\n\nusage: relaybus [global flags] %s", c.short, c.name())
		if hasFlags(fs) {
			fmt.Fprint(out, " [flags]")
		}
		if c.args != "" {
			fmt.Fprint(out, " "+c.args)
		}
		fmt.Fprintln(out)
		if hasFlags(fs) {
			fmt.Fprintln(out, "\nflags:")
			fs.PrintDefaults()
		}
		fmt.Fprintln(out, "\nglobal flags: relaybus --help")
	}
	return fs, run
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

const defaultAPI = "http://127.0.0.1:8080/dlqreplay"

func run(ctx context.Context, args []string, out, errOut io.Writer, hc *http.Client) int {
	fs := flag.NewFlagSet("relaybus", flag.ContinueOnError)
	fs.SetOutput(errOut)
	def := os.Getenv("RELAYBUS_API")
	if def == "" {
		def = defaultAPI
	}
	c := &cli{http: hc, out: out}
	fs.StringVar(&c.api, "api", def, "the dlqreplay API's base URL (default $RELAYBUS_API)")
	fs.StringVar(&c.api, "url", def, "the same as -api")
	fs.StringVar(&c.token, "token", os.Getenv("RELAYBUS_TOKEN"), "the static token of DLQREPLAY_AUTH=token, sent in X-Relaybus-Token to an https API only (default $RELAYBUS_TOKEN)")
	gcloud := fs.Bool("gcloud-auth", false, "send an ID token from gcloud auth print-identity-token for the API's service URL (dlqreplay on Cloud Run), to an https API only")
	fs.StringVar(&c.output, "o", "table", "output: table or json")
	fs.Usage = func() { mainHelp(out, fs) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	rest := fs.Args()
	if len(rest) == 0 || (len(rest) == 1 && rest[0] == "help") {
		mainHelp(out, fs)
		if len(rest) == 0 {
			return 2
		}
		return 0
	}
	if rest[0] == "help" {
		rest = append(rest[1:], "--help")
	}
	if c.output != "table" && c.output != "json" {
		fmt.Fprintln(errOut, "relaybus: -o must be table or json")
		return 2
	}
	cmd, cmdArgs := find(rest)
	if cmd == nil {
		group := groupOf(rest[0])
		if len(group) > 0 && (len(rest) == 1 || rest[1] == "--help" || rest[1] == "-h") {
			groupHelp(out, rest[0], group)
			if len(rest) == 1 {
				return 2
			}
			return 0
		}
		fmt.Fprintf(errOut, "relaybus: unknown command %q (relaybus --help lists them)\n", strings.Join(rest, " "))
		return 2
	}
	cfs, run := cmd.flagSet(out)
	if err := cfs.Parse(cmdArgs); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(errOut, "relaybus %s: %v (relaybus %s --help)\n", cmd.name(), err, cmd.name())
		return 2
	}
	if c.token != "" || *gcloud {
		if err := credentialsTo(c.api); err != nil {
			fmt.Fprintln(errOut, "relaybus:", err)
			return 2
		}
	}
	c.http = sameOrigin(hc)
	if *gcloud {
		tok, err := gcloudIDToken(ctx, c.api)
		if err != nil {
			fmt.Fprintln(errOut, "relaybus:", err)
			return 1
		}
		c.idToken = tok
	}
	if err := run(ctx, c, cfs.Args()); err != nil {
		fmt.Fprintln(errOut, "relaybus:", err)
		var u usageError
		if errors.As(err, &u) {
			return 2
		}
		return 1
	}
	return 0
}

// find returns the command the arguments name, and the rest.
func find(args []string) (*command, []string) {
	for _, cmd := range commands {
		if len(args) >= len(cmd.path) && strings.Join(args[:len(cmd.path)], " ") == cmd.name() {
			return cmd, args[len(cmd.path):]
		}
	}
	return nil, nil
}

// groupOf returns the commands under a first word with subcommands.
func groupOf(word string) []*command {
	var out []*command
	for _, cmd := range commands {
		if len(cmd.path) > 1 && cmd.path[0] == word {
			out = append(out, cmd)
		}
	}
	return out
}

func mainHelp(out io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(out, "relaybus: the operators' command line over the dlqreplay API (events, traces, dead letters, replays, the consumer registry)")
	fmt.Fprintln(out, "\nusage: relaybus [global flags] <command> [flags] [arguments]")
	fmt.Fprintln(out, "\ncommands:")
	printCommands(out, commands)
	fmt.Fprintln(out, "\nglobal flags:")
	fs.SetOutput(out)
	fs.PrintDefaults()
	fmt.Fprintln(out, "\nrelaybus <command> --help describes a command and its flags.")
}

func groupHelp(out io.Writer, word string, cmds []*command) {
	fmt.Fprintf(out, "relaybus %s: its commands\n\n", word)
	printCommands(out, cmds)
	fmt.Fprintf(out, "\nrelaybus %s <command> --help describes one.\n", word)
}

func printCommands(out io.Writer, cmds []*command) {
	width := 0
	for _, c := range cmds {
		width = max(width, len(c.name()+" "+c.args))
	}
	for _, c := range cmds {
		fmt.Fprintf(out, "  %-*s  %s\n", width, strings.TrimSpace(c.name()+" "+c.args), c.short)
	}
}

// credentialsTo refuses to send a token to api unless it is https, or
// http:// to this machine.
func credentialsTo(api string) error {
	u, err := url.Parse(api)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return usageError(fmt.Sprintf("--api %q is not an http(s) URL", api))
	}
	if u.Scheme == "http" && !loopback(u.Hostname()) {
		return usageError(fmt.Sprintf("--api %s: relaybus sends its token (--token, --gcloud-auth) only to an https API (http:// only for a loopback address)", u.Redacted()))
	}
	return nil
}

// loopback reports whether host is this machine (localhost, 127.0.0.0/8,
// ::1).
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// sameOrigin returns a copy of hc that follows a redirect only to the same
// scheme and host as the request it answers (a trailing slash, a moved
// path); one to anywhere else is an error, so the headers that carry a
// token are never sent there.
func sameOrigin(hc *http.Client) *http.Client {
	c := *hc
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		first := via[0].URL
		if req.URL.Scheme != first.Scheme || req.URL.Host != first.Host {
			return fmt.Errorf("the API redirected to %s://%s, which relaybus does not follow: it sends its token only to --api (set --api to the address that serves the API)", req.URL.Scheme, req.URL.Host)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return &c
}

// gcloudIDToken asks gcloud for an ID token whose audience is the API's
// service URL (what Cloud Run checks); a user account, which gcloud gives
// no custom audience, gets its default token, which Cloud Run also accepts
// (https://cloud.google.com/run/docs/authenticating/developers).
func gcloudIDToken(ctx context.Context, api string) (string, error) {
	u, err := url.Parse(api)
	if err != nil || u.Host == "" {
		return "", fmt.Errorf("--gcloud-auth: --api %q is not a URL", api)
	}
	gcloud := os.Getenv("RELAYBUS_GCLOUD")
	if gcloud == "" {
		gcloud = "gcloud"
	}
	audience := u.Scheme + "://" + u.Host
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, gcloud, "auth", "print-identity-token", "--audiences="+audience)
	cmd.Stderr = &stderr
	tok, err := cmd.Output()
	if err != nil && strings.Contains(strings.ToLower(stderr.String()), "audience") {
		stderr.Reset()
		cmd = exec.CommandContext(ctx, gcloud, "auth", "print-identity-token")
		cmd.Stderr = &stderr
		tok, err = cmd.Output()
	}
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = err.Error()
		}
		return "", fmt.Errorf("--gcloud-auth: gcloud auth print-identity-token: %s", msg)
	}
	t := strings.TrimSpace(string(tok))
	if strings.Count(t, ".") != 2 {
		return "", errors.New("--gcloud-auth: gcloud printed something that is not an ID token")
	}
	return t, nil
}

// do calls the API and renders the answer.
func (c *cli) do(ctx context.Context, method, path string, body any, render func(io.Writer, []byte) error) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.api, "/")+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("X-Relaybus-Token", c.token)
	}
	if c.idToken != "" {
		req.Header.Set("Authorization", "Bearer "+c.idToken)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		var e struct{ Code, Message string }
		if json.Unmarshal(b, &e) == nil && e.Code != "" {
			return fmt.Errorf("%d %s: %s", resp.StatusCode, e.Code, e.Message)
		}
		return fmt.Errorf("%s %s: %d", method, path, resp.StatusCode)
	}
	return c.show(b, render)
}

// show prints an answer b: indented JSON with -o json, else render's
// table.
func (c *cli) show(b []byte, render func(io.Writer, []byte) error) error {
	if c.output == "json" {
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return render(c.out, b)
}

// exactly checks a command's argument count.
func exactly(args []string, names ...string) error {
	if len(args) != len(names) {
		return usageError(fmt.Sprintf("want %d argument(s): %s (got %d)", len(names), strings.Join(names, " "), len(args)))
	}
	return nil
}

// query builds a query string from name/value pairs, leaving out empty values.
func query(kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

func seg(s string) string { return url.PathEscape(s) }

// timeFlag checks an RFC 3339 flag value before the API does.
func timeFlag(name, v string) error {
	if v == "" {
		return nil
	}
	if _, err := time.Parse(time.RFC3339, v); err != nil {
		return usageError(fmt.Sprintf("--%s: an RFC 3339 time such as 2026-11-22T09:00:00Z, got %q", name, v))
	}
	return nil
}
