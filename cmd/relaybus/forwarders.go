package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
)

// The commands of the forward consumers added at run time (the API's
// /forwarders; docs/forwarding.md), after the others in help.
func init() {
	commands = append(commands,
		&command{path: []string{"forwarders", "ls"}, short: "the forward consumers added at run time, with their subscriptions",
			setup: func(fs *flag.FlagSet) runner {
				topic := fs.String("topic", "", "one topic's forwarders")
				return func(ctx context.Context, c *cli, args []string) error {
					if err := exactly(args); err != nil {
						return err
					}
					return c.do(ctx, "GET", "/forwarders"+query("topic", *topic), nil, renderForwarders)
				}
			}},
		&command{path: []string{"forwarders", "add"}, args: "NAME", short: "add a forward consumer: it receives the topic's events from now on, without a deploy",
			setup: func(fs *flag.FlagSet) runner {
				b := forwarderFlags(fs)
				return func(ctx context.Context, c *cli, args []string) error {
					if err := exactly(args, "NAME"); err != nil {
						return err
					}
					body := b.body(fs)
					body["name"] = args[0]
					return c.do(ctx, "POST", "/forwarders", body, renderForwarder)
				}
			}},
		&command{path: []string{"forwarders", "set"}, args: "NAME", short: "change a forwarder's URL, auth, flow limits, timeout or description (the flags given), or rotate its signing secret",
			setup: func(fs *flag.FlagSet) runner {
				b := forwarderFlags(fs)
				rotate := fs.Bool("rotate-secret", false, "an hmac forwarder: a new signing secret, printed once; the previous one signs beside it for 24 hours")
				return func(ctx context.Context, c *cli, args []string) error {
					if err := exactly(args, "NAME"); err != nil {
						return err
					}
					body := b.body(fs)
					if *rotate {
						body["rotateSecret"] = true
					}
					if len(body) == 0 {
						return usageError("give at least one flag to change")
					}
					return c.do(ctx, "PATCH", "/forwarders/"+seg(args[0]), body, renderForwarder)
				}
			}},
		&command{path: []string{"forwarders", "rm"}, args: "NAME", short: "remove a forwarder: its subscription is deleted and delivery stops",
			setup: func(fs *flag.FlagSet) runner {
				return func(ctx context.Context, c *cli, args []string) error {
					if err := exactly(args, "NAME"); err != nil {
						return err
					}
					return c.do(ctx, "DELETE", "/forwarders/"+seg(args[0]), nil, renderForwarder)
				}
			}},
	)
}

// forwarderFlagValues are a forwarder's flags.
type forwarderFlagValues struct {
	topic, url, auth, audience, filter, description *string
	maxInFlight, timeout                            *int
	maxPerSecond                                    *float64
}

func forwarderFlags(fs *flag.FlagSet) *forwarderFlagValues {
	return &forwarderFlagValues{
		topic:        fs.String("topic", "", "the topic it receives, e.g. shop.order.events (fixed once added)"),
		url:          fs.String("url", "", "where each event is POSTed as a CloudEvent (http(s), no credentials in it)"),
		auth:         fs.String("auth", "", "none (default), google (a Google-signed ID token) or hmac (signed; the secret is made and printed once)"),
		audience:     fs.String("audience", "", "the ID token's audience with --auth google (default: the URL)"),
		filter:       fs.String("filter", "", "a Pub/Sub filter on the attributes, e.g. attributes.event_type = \"order.purchased\" (fixed once added)"),
		description:  fs.String("description", "", "what it is for"),
		maxInFlight:  fs.Int("max-in-flight", 0, "the most deliveries at once per instance (0: no bound)"),
		maxPerSecond: fs.Float64("max-per-second", 0, "the most deliveries a second per instance (0: no limit)"),
		timeout:      fs.Int("timeout-seconds", 0, "bounds one forward (0: 10 s)"),
	}
}

// body is the flags the command line set, by the API's field names.
func (v *forwarderFlagValues) body(fs *flag.FlagSet) map[string]any {
	all := map[string]any{"topic": *v.topic, "url": *v.url, "auth": *v.auth, "audience": *v.audience, "filter": *v.filter,
		"description": *v.description, "max-in-flight": *v.maxInFlight, "max-per-second": *v.maxPerSecond, "timeout-seconds": *v.timeout}
	field := map[string]string{"max-in-flight": "maxInFlight", "max-per-second": "maxPerSecond", "timeout-seconds": "timeoutSeconds"}
	out := map[string]any{}
	fs.Visit(func(f *flag.Flag) {
		if val, ok := all[f.Name]; ok {
			name := f.Name
			if n, ok := field[name]; ok {
				name = n
			}
			out[name] = val
		}
	})
	return out
}

type forwarderRow struct {
	Name, Topic, URL, Auth, Subscription, PushEndpoint, Filter, Description string
	MaxInFlight                                                             int
	MaxPerSecond                                                            float64
	TimeoutSeconds                                                          int
	Revision                                                                int64
	PreviousSecretUntil                                                     string
}

func (f forwarderRow) flow() string {
	var parts []string
	if f.MaxInFlight > 0 {
		parts = append(parts, fmt.Sprintf("%d in flight", f.MaxInFlight))
	}
	if f.MaxPerSecond > 0 {
		parts = append(parts, fmt.Sprintf("%g/s", f.MaxPerSecond))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// renderForwarders prints GET /forwarders as a table.
func renderForwarders(w io.Writer, b []byte) error {
	var p struct{ Forwarders []forwarderRow }
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	var rows [][]string
	for _, f := range p.Forwarders {
		rows = append(rows, []string{f.Name, f.Topic, f.URL, f.Auth, f.flow(), fmt.Sprint(f.Revision)})
	}
	return table(w, "NAME\tTOPIC\tURL\tAUTH\tFLOW\tREVISION", rows)
}

// renderForwarder prints one forwarder's answer (add, set, rm).
func renderForwarder(w io.Writer, b []byte) error {
	var p struct {
		Forwarder        forwarderRow
		Changed, Removed bool
		SigningSecret    *struct{ Secret, Note string }
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	f := p.Forwarder
	state := "unchanged"
	switch {
	case p.Removed:
		state = "removed: its subscription is deleted, delivery has stopped"
	case p.Changed:
		state = fmt.Sprintf("revision %d", f.Revision)
	}
	rows := [][]string{{"name", f.Name}, {"topic", f.Topic}, {"url", f.URL}, {"auth", f.Auth}, {"flow", f.flow()},
		{"subscription", f.Subscription}, {"push endpoint", f.PushEndpoint}, {"state", state}}
	if f.Filter != "" {
		rows = append(rows, []string{"filter", f.Filter})
	}
	if f.Description != "" {
		rows = append(rows, []string{"description", f.Description})
	}
	if f.PreviousSecretUntil != "" {
		rows = append(rows, []string{"previous secret", "signs too until " + f.PreviousSecretUntil})
	}
	if err := table(w, "FIELD\tVALUE", rows); err != nil {
		return err
	}
	if s := p.SigningSecret; s != nil {
		// Shown this once: on its own line, to copy.
		_, err := fmt.Fprintf(w, "\nsigning secret: %s\n%s\n", s.Secret, s.Note)
		return err
	}
	return nil
}
