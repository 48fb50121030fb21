package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"
)

// The scheduled-event commands (docs/producing.md, "Scheduled events"),
// after the others in help.
func init() {
	commands = append(commands,
		&command{path: []string{"scheduled", "ls"}, short: "scheduled events not yet published, by the time they are due",
			setup: func(fs *flag.FlagSet) runner {
				limit := fs.Int("limit", 0, "events per outbox database, 1 to 500 (default 100)")
				return func(ctx context.Context, c *cli, args []string) error {
					if err := exactly(args); err != nil {
						return err
					}
					n := ""
					if *limit != 0 {
						n = strconv.Itoa(*limit)
					}
					return c.do(ctx, "GET", "/scheduled"+query("limit", n), nil, renderScheduled)
				}
			}},
		&command{path: []string{"scheduled", "cancel"}, args: "EVENT_ID", short: "cancel a scheduled event before it is due (it is never published)",
			setup: func(fs *flag.FlagSet) runner {
				reason := fs.String("reason", "", "why, for the audit log")
				return func(ctx context.Context, c *cli, args []string) error {
					if err := exactly(args, "EVENT_ID"); err != nil {
						return err
					}
					return c.do(ctx, "POST", "/scheduled/"+seg(args[0])+":cancel", map[string]any{"reason": *reason}, renderKV)
				}
			}},
	)
}

// renderScheduled prints GET /scheduled as a table.
func renderScheduled(w io.Writer, b []byte) error {
	var p struct {
		Scheduled []struct {
			EventID, Topic, EventType, AggregateType, AggregateID, Database string
			Version                                                         int64
			DeliverAt                                                       time.Time
			Due                                                             bool
		}
		Truncated bool
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	var rows [][]string
	for _, s := range p.Scheduled {
		state := "waiting"
		if s.Due {
			state = "due"
		}
		rows = append(rows, []string{s.DeliverAt.Format(time.RFC3339), s.EventID, s.Topic, s.AggregateType + "/" + s.AggregateID,
			fmt.Sprint(s.Version), state})
	}
	if err := table(w, "DELIVER AT\tEVENT\tTOPIC\tAGGREGATE\tVERSION\tSTATE", rows); err != nil {
		return err
	}
	if p.Truncated {
		_, err := fmt.Fprintln(w, "(more: raise --limit)")
		return err
	}
	return nil
}
