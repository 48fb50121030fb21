// Command relaybus is the operator's command line over the dlqreplay API.
//
//	relaybus [flags] events ls [--status S] [--topic T] [--service S] [--trace ID]
//	relaybus [flags] events show EVENT_ID
//	relaybus [flags] events trace EVENT_ID
//	relaybus [flags] dlq ls [--topic T] [--consumer C] [--reason R]
//	relaybus [flags] dlq show ID
//	relaybus [flags] dlq replay [--dry-run] ID
//	relaybus [flags] dlq rm ID
//	relaybus [flags] repush [--consumer C] EVENT_ID
//	relaybus [flags] seek --time RFC3339|--snapshot NAME SUBSCRIPTION
//
// Subcommand flags come before the id.
//
// Flags: --api (default $RELAYBUS_API or http://127.0.0.1:8080/dlqreplay),
// --token (a bearer token; default $RELAYBUS_TOKEN), --gcloud-auth (use
// `gcloud auth print-identity-token`, for the API on Cloud Run), -o table|json.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, http.DefaultClient))
}

type cli struct {
	api, token, output string
	http               *http.Client
	out                io.Writer
}

func run(ctx context.Context, args []string, out, errOut io.Writer, hc *http.Client) int {
	fs := flag.NewFlagSet("relaybus", flag.ContinueOnError)
	fs.SetOutput(errOut)
	def := os.Getenv("RELAYBUS_API")
	if def == "" {
		def = "http://127.0.0.1:8080/dlqreplay"
	}
	c := &cli{http: hc, out: out}
	fs.StringVar(&c.api, "api", def, "the dlqreplay API's base URL")
	fs.StringVar(&c.token, "token", os.Getenv("RELAYBUS_TOKEN"), "bearer token")
	gcloud := fs.Bool("gcloud-auth", false, "authenticate with `gcloud auth print-identity-token`")
	fs.StringVar(&c.output, "o", "table", "output: table or json")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *gcloud {
		tok, err := exec.CommandContext(ctx, "gcloud", "auth", "print-identity-token").Output()
		if err != nil {
			fmt.Fprintln(errOut, "relaybus: gcloud auth print-identity-token:", err)
			return 1
		}
		c.token = strings.TrimSpace(string(tok))
	}
	if c.output != "table" && c.output != "json" {
		fmt.Fprintln(errOut, "relaybus: -o must be table or json")
		return 2
	}
	if err := c.dispatch(ctx, fs.Args()); err != nil {
		fmt.Fprintln(errOut, "relaybus:", err)
		var u usageError
		if errors.As(err, &u) {
			return 2
		}
		return 1
	}
	return 0
}

type usageError string

func (u usageError) Error() string { return string(u) }

const usage = "usage: relaybus [--api URL] [--token T|--gcloud-auth] [-o table|json] " +
	"events ls|show|trace, dlq ls|show|replay|rm, repush [--consumer C] EVENT_ID, seek --time T|--snapshot S SUBSCRIPTION"

func (c *cli) dispatch(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageError(usage)
	}
	sub := func(name string, a []string, flags func(*flag.FlagSet)) ([]string, error) {
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		if flags != nil {
			flags(fs)
		}
		if err := fs.Parse(a); err != nil {
			return nil, usageError(name + ": " + err.Error())
		}
		return fs.Args(), nil
	}
	one := func(rest []string, what string) (string, error) {
		if len(rest) != 1 {
			return "", usageError(what + " needs exactly one id")
		}
		return url.PathEscape(rest[0]), nil
	}
	verb := ""
	if len(args) > 1 {
		verb = args[1]
	}
	switch {
	case args[0] == "events" && verb == "ls":
		q := url.Values{}
		var status, topic, service, trace string
		if _, err := sub("events ls", args[2:], func(fs *flag.FlagSet) {
			fs.StringVar(&status, "status", "", "")
			fs.StringVar(&topic, "topic", "", "")
			fs.StringVar(&service, "service", "", "")
			fs.StringVar(&trace, "trace", "", "")
		}); err != nil {
			return err
		}
		set(q, "status", status, "topic", topic, "service", service, "traceId", trace)
		return c.do(ctx, "GET", "/events?"+q.Encode(), nil, renderEvents)
	case args[0] == "events" && (verb == "show" || verb == "trace"):
		id, err := one(args[2:], "events "+verb)
		if err != nil {
			return err
		}
		if verb == "show" {
			return c.do(ctx, "GET", "/events/"+id, nil, renderEvent)
		}
		return c.do(ctx, "GET", "/traces/"+id, nil, renderTrace)
	case args[0] == "dlq" && verb == "ls":
		q := url.Values{}
		var topic, consumer, reason string
		if _, err := sub("dlq ls", args[2:], func(fs *flag.FlagSet) {
			fs.StringVar(&topic, "topic", "", "")
			fs.StringVar(&consumer, "consumer", "", "")
			fs.StringVar(&reason, "reason", "", "")
		}); err != nil {
			return err
		}
		set(q, "topic", topic, "consumer", consumer, "reason", reason)
		return c.do(ctx, "GET", "/deadletters?"+q.Encode(), nil, renderLetters)
	case args[0] == "dlq" && (verb == "show" || verb == "rm"):
		id, err := one(args[2:], "dlq "+verb)
		if err != nil {
			return err
		}
		if verb == "show" {
			return c.do(ctx, "GET", "/deadletters/"+id, nil, renderLetter)
		}
		return c.do(ctx, "DELETE", "/deadletters/"+id, nil, renderLetter)
	case args[0] == "dlq" && verb == "replay":
		var dry bool
		rest, err := sub("dlq replay", args[2:], func(fs *flag.FlagSet) { fs.BoolVar(&dry, "dry-run", false, "") })
		if err != nil {
			return err
		}
		id, err := one(rest, "dlq replay")
		if err != nil {
			return err
		}
		return c.do(ctx, "POST", "/deadletters/"+id+":replay", map[string]bool{"dryRun": dry}, renderKV)
	case args[0] == "seek":
		var at, snapshot string
		rest, err := sub("seek", args[1:], func(fs *flag.FlagSet) {
			fs.StringVar(&at, "time", "", "")
			fs.StringVar(&snapshot, "snapshot", "", "")
		})
		if err != nil {
			return err
		}
		name, err := one(rest, "seek")
		if err != nil {
			return err
		}
		return c.do(ctx, "POST", "/subscriptions/"+name+":seek", map[string]string{"time": at, "snapshot": snapshot}, renderKV)
	case args[0] == "repush":
		var consumer string
		rest, err := sub("repush", args[1:], func(fs *flag.FlagSet) { fs.StringVar(&consumer, "consumer", "", "") })
		if err != nil {
			return err
		}
		id, err := one(rest, "repush")
		if err != nil {
			return err
		}
		return c.do(ctx, "POST", "/events/"+id+":repush", map[string]string{"consumer": consumer}, renderKV)
	}
	return usageError(usage)
}

func set(q url.Values, kv ...string) {
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			q.Set(kv[i], kv[i+1])
		}
	}
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
		req.Header.Set("Authorization", "Bearer "+c.token)
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

// The API's shapes, as far as the tables show them.
type (
	eventDoc struct {
		EventID, EventType, Topic, AggregateID, Status, ParentEventID, TraceID string
		Version                                                                int64
		OccurredAt                                                             time.Time
		RetryCount                                                             int
	}
	attempt struct {
		AttemptNo             int
		Outcome, ErrorCode    string
		ErrorMessage          string
		Success               bool
		ConsumerID, MessageID string
	}
	consumerReport struct {
		ConsumerID string
		State      string
		Attempts   []attempt
	}
	detail struct {
		Event                         eventDoc
		Consumers                     []consumerReport
		Expected, Reported, Succeeded int
	}
	node struct {
		Event    eventDoc
		Children []*node
	}
	letter struct {
		ID, Topic, Consumer, Reason, Error, EventID, Subscription, DeletedBy string
		Deliveries                                                           int
		Deleted                                                              bool
		Replays                                                              []struct{ By, MessageID, Consumer string }
		Ledger                                                               *detail
	}
)

func table(w io.Writer, header string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func renderEvents(w io.Writer, b []byte) error {
	var p struct {
		Events        []eventDoc
		NextPageToken string
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	var rows [][]string
	for _, e := range p.Events {
		rows = append(rows, []string{e.EventID, e.EventType, e.AggregateID, fmt.Sprint(e.Version), e.Status, e.OccurredAt.UTC().Format(time.RFC3339)})
	}
	if err := table(w, "EVENT\tTYPE\tAGGREGATE\tVERSION\tSTATUS\tOCCURRED", rows); err != nil {
		return err
	}
	if p.NextPageToken != "" {
		fmt.Fprintln(w, "more: --page-token", p.NextPageToken)
	}
	return nil
}

func renderEvent(w io.Writer, b []byte) error {
	var d detail
	if err := json.Unmarshal(b, &d); err != nil {
		return err
	}
	e := d.Event
	fmt.Fprintf(w, "%s %s %s v%d on %s\nstatus %s, %d/%d consumed, re-pushed %d times, trace %s\n",
		e.EventID, e.EventType, e.AggregateID, e.Version, e.Topic, e.Status, d.Succeeded, d.Expected, e.RetryCount, e.TraceID)
	var rows [][]string
	for _, c := range d.Consumers {
		if len(c.Attempts) == 0 {
			rows = append(rows, []string{c.ConsumerID, "-", "waiting", ""})
		}
		for _, a := range c.Attempts {
			rows = append(rows, []string{c.ConsumerID, fmt.Sprint(a.AttemptNo), a.Outcome, strings.TrimSpace(a.ErrorCode + " " + a.ErrorMessage)})
		}
	}
	return table(w, "CONSUMER\tATTEMPT\tOUTCOME\tERROR", rows)
}

func renderTrace(w io.Writer, b []byte) error {
	var t struct {
		TraceID string
		Roots   []*node
		Count   int
	}
	if err := json.Unmarshal(b, &t); err != nil {
		return err
	}
	fmt.Fprintf(w, "trace %s (%d events)\n", t.TraceID, t.Count)
	var walk func(ns []*node, prefix string)
	walk = func(ns []*node, prefix string) {
		for i, n := range ns {
			branch, next := "├─ ", "│  "
			if i == len(ns)-1 {
				branch, next = "└─ ", "   "
			}
			e := n.Event
			fmt.Fprintf(w, "%s%s%s %s v%d [%s] %s\n", prefix, branch, e.EventType, e.AggregateID, e.Version, e.Status, e.EventID)
			walk(n.Children, prefix+next)
		}
	}
	walk(t.Roots, "")
	return nil
}

func renderLetters(w io.Writer, b []byte) error {
	var p struct {
		DeadLetters   []letter
		NextPageToken string
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	var rows [][]string
	for _, l := range p.DeadLetters {
		rows = append(rows, []string{l.ID, l.Topic, l.Consumer, l.Reason, l.EventID, fmt.Sprint(len(l.Replays))})
	}
	return table(w, "ID\tTOPIC\tCONSUMER\tREASON\tEVENT\tREPLAYS", rows)
}

func renderLetter(w io.Writer, b []byte) error {
	var l letter
	if err := json.Unmarshal(b, &l); err != nil {
		return err
	}
	fmt.Fprintf(w, "dead letter %s from %s\nconsumer %s (%s), reason %s, deliveries %d\nerror: %s\nevent %s\n",
		l.ID, l.Topic, l.Consumer, l.Subscription, l.Reason, l.Deliveries, l.Error, l.EventID)
	for _, r := range l.Replays {
		fmt.Fprintf(w, "replayed by %s to %s as message %s\n", r.By, r.Consumer, r.MessageID)
	}
	if l.Deleted {
		fmt.Fprintf(w, "deleted by %s\n", l.DeletedBy)
	}
	if l.Ledger != nil {
		fmt.Fprintf(w, "ledger: %s, %d/%d consumed\n", l.Ledger.Event.Status, l.Ledger.Succeeded, l.Ledger.Expected)
	}
	return nil
}

func renderKV(w io.Writer, b []byte) error {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var rows [][]string
	for _, k := range keys {
		rows = append(rows, []string{k, fmt.Sprint(m[k])})
	}
	return table(w, "FIELD\tVALUE", rows)
}
