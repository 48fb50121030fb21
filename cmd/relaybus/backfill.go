package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// backfillCommands are the backfills' commands (the API's POST /backfills,
// GET /backfills, POST /backfills/{id}:run|pause|resume|cancel). A
// command's subcommands come before it: the first path that matches wins.
var backfillCommands = []*command{
	{path: []string{"backfill", "run"}, args: "ID", short: "drive a backfill until it ends or is paused (it advances while a caller drives it)",
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "ID"); err != nil {
					return err
				}
				return driveBackfill(ctx, c, args[0])
			}
		}},
	{path: []string{"backfill", "show"}, args: "ID", short: "one backfill's progress: matched, queued, remaining, rate, ETA",
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "ID"); err != nil {
					return err
				}
				return c.do(ctx, "GET", "/backfills/"+seg(args[0]), nil, renderBackfill)
			}
		}},
	backfillAction("pause", "stop queueing a backfill's events (resume continues from its cursor)"),
	backfillAction("resume", "let a paused backfill run again (then `relaybus backfill run ID`)"),
	backfillAction("cancel", "end a backfill: it queues nothing more"),
	{path: []string{"backfill"}, short: "deliver a topic's history to one consumer alone, through its own inbox (Ctrl-C leaves it running: `relaybus backfill run ID` continues it)",
		setup: func(fs *flag.FlagSet) runner {
			topic := fs.String("topic", "", "the topic (required)")
			consumer := fs.String("consumer", "", "the consumer to backfill (required)")
			since := fs.String("since", "", "events that occurred at or after (RFC 3339, required)")
			until := fs.String("until", "", "events that occurred before (RFC 3339; default now, the watermark: the consumer's subscription must exist by then)")
			aggs := fs.String("aggregates", "", "only these aggregate ids, comma-separated")
			rate := fs.Float64("rate", 0, "events per second queued, 1 to 100000 (default 1000)")
			database := fs.String("database", "", "the database whose outbox holds the topic's events (default main)")
			dry := fs.Bool("dry-run", false, "only count the events; queue nothing")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				if *topic == "" || *consumer == "" || *since == "" {
					return usageError("give --topic, --consumer and --since")
				}
				for name, v := range map[string]string{"since": *since, "until": *until} {
					if v == "" {
						continue
					}
					if err := timeFlag(name, v); err != nil {
						return err
					}
				}
				body := map[string]any{"topic": *topic, "consumer": *consumer, "since": *since, "until": *until,
					"database": *database, "dryRun": *dry}
				if *aggs != "" {
					body["aggregates"] = strings.Split(*aggs, ",")
				}
				if *rate != 0 {
					body["rate"] = *rate
				}
				if *dry {
					return c.do(ctx, "POST", "/backfills", body, renderBackfillCount)
				}
				var b backfill
				if err := c.call(ctx, "POST", "/backfills", body, &b); err != nil {
					return err
				}
				return driveBackfill(ctx, c, b.ID)
			}
		}},
	{path: []string{"backfills"}, short: "the backfills, newest first, with their progress",
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				return c.do(ctx, "GET", "/backfills", nil, renderBackfills)
			}
		}},
}

func backfillAction(action, short string) *command {
	return &command{path: []string{"backfill", action}, args: "ID", short: short,
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "ID"); err != nil {
					return err
				}
				return c.do(ctx, "POST", "/backfills/"+seg(args[0])+":"+action, nil, renderBackfill)
			}
		}}
}

// driveBackfill calls POST /backfills/{id}:run until the backfill is no
// longer running, printing its progress after each slice (tables only),
// then the backfill.
func driveBackfill(ctx context.Context, c *cli, id string) error {
	for {
		var b backfill
		if err := c.call(ctx, "POST", "/backfills/"+seg(id)+":run", nil, &b); err != nil {
			return err
		}
		if b.State != "running" {
			return c.do(ctx, "GET", "/backfills/"+seg(id), nil, renderBackfill)
		}
		if c.output == "table" {
			fmt.Fprintf(c.out, "backfill %s: %d/%d events queued, %.0f/s, %d remaining, eta %s\n", b.ID, b.Queued, b.Matched,
				b.MeasuredRate, b.Remaining, b.eta())
		}
	}
}

// backfill is a backfill as the API answers it.
type backfill struct {
	ID, Topic, Consumer, State, CreatedBy string
	Since, Until, CreatedAt               time.Time
	Aggregates                            []string
	Rate, MeasuredRate, ETASeconds        float64
	Matched, Queued, Remaining            int64
}

func (b backfill) eta() string {
	if b.State != "running" || b.MeasuredRate == 0 {
		return "-"
	}
	return (time.Duration(b.ETASeconds) * time.Second).String()
}

func (b backfill) scope() string {
	s := fmt.Sprintf("%s to %s, %s..%s", b.Topic, b.Consumer, b.Since.Format(time.RFC3339), b.Until.Format(time.RFC3339))
	if len(b.Aggregates) > 0 {
		s += " aggregates " + strings.Join(b.Aggregates, ",")
	}
	return s
}

func renderBackfillCount(w io.Writer, b []byte) error {
	var r struct {
		Matched int64
		Rate    float64
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d event(s) to backfill; run again without --dry-run to queue them at %g/s\n", r.Matched, r.Rate)
	return err
}

func renderBackfill(w io.Writer, raw []byte) error {
	var b backfill
	if err := json.Unmarshal(raw, &b); err != nil {
		return err
	}
	rows := [][]string{
		{"backfill", b.ID}, {"state", b.State}, {"scope", b.scope()}, {"by", b.CreatedBy},
		{"matched", fmt.Sprint(b.Matched)}, {"queued", fmt.Sprint(b.Queued)}, {"remaining", fmt.Sprint(b.Remaining)},
		{"rate", fmt.Sprintf("%.0f/s (limit %g/s)", b.MeasuredRate, b.Rate)}, {"eta", b.eta()},
	}
	switch b.State {
	case "running":
		rows = append(rows, []string{"next", "relaybus backfill run " + b.ID + "; pause: relaybus backfill pause " + b.ID})
	case "paused":
		rows = append(rows, []string{"next", "relaybus backfill resume " + b.ID + ", then relaybus backfill run " + b.ID})
	}
	return table(w, "FIELD\tVALUE", rows)
}

func renderBackfills(w io.Writer, raw []byte) error {
	var r struct{ Backfills []backfill }
	if err := json.Unmarshal(raw, &r); err != nil {
		return err
	}
	if len(r.Backfills) == 0 {
		_, err := fmt.Fprintln(w, "no backfills")
		return err
	}
	var rows [][]string
	for _, b := range r.Backfills {
		rows = append(rows, []string{b.ID, b.State, b.scope(), fmt.Sprintf("%d/%d", b.Queued, b.Matched),
			fmt.Sprintf("%.0f/s", b.MeasuredRate), b.eta()})
	}
	return table(w, "BACKFILL\tSTATE\tSCOPE\tQUEUED\tRATE\tETA", rows)
}

// The backfills' commands follow the others in help.
func init() { commands = append(commands, backfillCommands...) }
