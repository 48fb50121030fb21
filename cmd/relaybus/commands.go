package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strconv"
)

// runner is what a command runs.
type runner = func(ctx context.Context, c *cli, args []string) error

// commands lists every command, in the order help shows them.
var commands = []*command{
	{path: []string{"overview"}, short: "events by status, dead letters per topic and consumer, outbox backlog, lag of each hop",
		setup: func(fs *flag.FlagSet) runner {
			window := fs.String("window", "", "the status counts' window, e.g. 1h or 24h (default 24h)")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				return c.do(ctx, "GET", "/overview"+query("window", *window), nil, renderOverview)
			}
		}},
	{path: []string{"events", "ls"}, short: "list events, newest first, with n/m consumed",
		setup: func(fs *flag.FlagSet) runner {
			status := fs.String("status", "", "PENDING, SENT, CONSUMED, PARTIAL, FAILED, RETRYING or EXPIRED")
			topic := fs.String("topic", "", "a topic, e.g. shop.order.events")
			typ := fs.String("type", "", "an event type, e.g. order.purchased")
			service := fs.String("service", "", "the initiator's service")
			trace := fs.String("trace", "", "a trace id")
			aggregate := fs.String("aggregate", "", "an aggregate id")
			from := fs.String("from", "", "occurred at or after (RFC 3339)")
			to := fs.String("to", "", "occurred before (RFC 3339)")
			size := fs.Int("page-size", 0, "events per page, 1 to 500 (default 50)")
			token := fs.String("page-token", "", "the next page, as the previous page printed it")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				if err := timeFlag("from", *from); err != nil {
					return err
				}
				if err := timeFlag("to", *to); err != nil {
					return err
				}
				n := ""
				if *size != 0 {
					n = strconv.Itoa(*size)
				}
				return c.do(ctx, "GET", "/events"+query("status", *status, "topic", *topic, "eventType", *typ, "service", *service,
					"traceId", *trace, "aggregateId", *aggregate, "from", *from, "to", *to, "pageSize", n, "pageToken", *token), nil, renderEvents)
			}
		}},
	{path: []string{"events", "show"}, args: "EVENT_ID", short: "one event: payload, every consumer's attempts, outbox state, parent and children",
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "EVENT_ID"); err != nil {
					return err
				}
				return c.do(ctx, "GET", "/events/"+seg(args[0]), nil, renderEvent)
			}
		}},
	{path: []string{"events", "trace"}, args: "EVENT_ID", short: "the trace an event belongs to, as a tree",
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "EVENT_ID"); err != nil {
					return err
				}
				return c.do(ctx, "GET", "/traces/"+seg(args[0]), nil, renderTrace)
			}
		}},
	{path: []string{"repush"}, args: "EVENT_ID", short: "re-push an event through the outbox, to one consumer or all (the re-push rules apply)",
		setup: func(fs *flag.FlagSet) runner {
			consumer := fs.String("consumer", "", "the one consumer to re-push to (default: every consumer)")
			dry := fs.Bool("dry-run", false, "only say whether the re-push rules allow it")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "EVENT_ID"); err != nil {
					return err
				}
				return c.do(ctx, "POST", "/events/"+seg(args[0])+":repush", map[string]any{"consumer": *consumer, "dryRun": *dry}, renderKV)
			}
		}},
	{path: []string{"dlq", "ls"}, short: "list dead letters, newest first",
		setup: func(fs *flag.FlagSet) runner {
			topic := fs.String("topic", "", "the original topic")
			consumer := fs.String("consumer", "", "the consumer that failed it")
			reason := fs.String("reason", "", "e.g. max_delivery_attempts, missing_aggregate_id")
			ev := fs.String("event", "", "an event id")
			since := fs.String("since", "", "archived at or after (RFC 3339)")
			until := fs.String("until", "", "archived before (RFC 3339)")
			deleted := fs.Bool("deleted", false, "include deleted letters (tombstones)")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				if err := timeFlag("since", *since); err != nil {
					return err
				}
				if err := timeFlag("until", *until); err != nil {
					return err
				}
				d := ""
				if *deleted {
					d = "true"
				}
				return c.do(ctx, "GET", "/deadletters"+query("topic", *topic, "consumer", *consumer, "reason", *reason, "eventId", *ev,
					"since", *since, "until", *until, "deleted", d), nil, renderLetters)
			}
		}},
	{path: []string{"dlq", "show"}, args: "ID", short: "one dead letter: why, where, its replays and its event's attempts",
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "ID"); err != nil {
					return err
				}
				return c.do(ctx, "GET", "/deadletters/"+seg(args[0]), nil, renderLetter)
			}
		}},
	{path: []string{"dlq", "replay"}, args: "ID", short: "replay a dead letter to the consumer that failed it, only",
		setup: func(fs *flag.FlagSet) runner {
			dry := fs.Bool("dry-run", false, "say what the replay would do: deliver, no-op (inbox), blocked (order) or poison")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "ID"); err != nil {
					return err
				}
				return c.do(ctx, "POST", "/deadletters/"+seg(args[0])+":replay", map[string]bool{"dryRun": *dry}, renderPlan)
			}
		}},
	{path: []string{"dlq", "replay-all"}, short: "replay every dead letter a filter matches, each to its consumer (counts first)",
		setup: func(fs *flag.FlagSet) runner {
			topic := fs.String("topic", "", "the original topic")
			consumer := fs.String("consumer", "", "the consumer that failed them")
			reason := fs.String("reason", "", "the reason")
			again := fs.Bool("include-replayed", false, "also letters replayed before")
			yes := fs.Bool("yes", false, "replay; without it only the count is shown")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				if *topic == "" && *consumer == "" && *reason == "" {
					return usageError("give at least one of --topic, --consumer, --reason")
				}
				body := map[string]any{"topic": *topic, "consumer": *consumer, "reason": *reason, "includeReplayed": *again, "dryRun": true}
				if !*yes {
					return c.do(ctx, "POST", "/deadletters:replay", body, renderBatch)
				}
				var count struct{ Matched int }
				if err := c.call(ctx, "POST", "/deadletters:replay", body, &count); err != nil {
					return err
				}
				body["dryRun"], body["expect"] = false, count.Matched
				return c.do(ctx, "POST", "/deadletters:replay", body, renderBatch)
			}
		}},
	{path: []string{"dlq", "rm"}, args: "ID", short: "delete a dead letter (kept as a tombstone saying who and when)",
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "ID"); err != nil {
					return err
				}
				return c.do(ctx, "DELETE", "/deadletters/"+seg(args[0]), nil, renderLetter)
			}
		}},
	{path: []string{"consumers", "ls"}, short: "the consumer registry (topic_consumers) with each consumer's subscription",
		setup: func(fs *flag.FlagSet) runner {
			topic := fs.String("topic", "", "one topic's consumers")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				return c.do(ctx, "GET", "/consumers"+query("topic", *topic), nil, renderConsumers)
			}
		}},
	{path: []string{"consumers", "enable"}, args: "TOPIC CONSUMER", short: "expect CONSUMER on events sent to TOPIC from now on",
		setup: func(fs *flag.FlagSet) runner { return toggle(true) }},
	{path: []string{"consumers", "disable"}, args: "TOPIC CONSUMER", short: "stop expecting CONSUMER on events sent to TOPIC from now on",
		setup: func(fs *flag.FlagSet) runner { return toggle(false) }},
	{path: []string{"consumers", "pause"}, args: "TOPIC CONSUMER", short: "stop delivery to a consumer (any kind, any broker): messages wait or are kept, no attempt is counted",
		setup: func(fs *flag.FlagSet) runner { return pause("pause") }},
	{path: []string{"consumers", "resume"}, args: "TOPIC CONSUMER", short: "restart delivery to a paused consumer; what was kept while paused is published to it again",
		setup: func(fs *flag.FlagSet) runner { return pause("resume") }},
	{path: []string{"consumers", "rebuild"}, args: "TOPIC CONSUMER", short: "rebuild a consumer's projection: pause, clear it and its inbox, seek (or backfill from the history), resume (--dry-run first)",
		setup: func(fs *flag.FlagSet) runner {
			at := fs.String("time", "", "replay every message retained since this time (RFC 3339)")
			snapshot := fs.String("snapshot", "", "replay from this snapshot")
			aggType := fs.String("aggregate-type", "", "clear only this aggregate type's projection (default: all)")
			fromHistory := fs.Bool("history", false, "replay from the event history (a backfill to the consumer alone, driven to its end) instead of a seek")
			database := fs.String("database", "", "with --history: the database whose outbox holds the topic's events (default main)")
			rate := fs.Float64("rate", 0, "with --history: events per second (default 1000)")
			dry := fs.Bool("dry-run", false, "say what would be cleared and replayed; change nothing")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "TOPIC", "CONSUMER"); err != nil {
					return err
				}
				if (*at == "") == (*snapshot == "") {
					return usageError("give exactly one of --time and --snapshot")
				}
				if err := timeFlag("time", *at); err != nil {
					return err
				}
				path := fmt.Sprintf("/consumers/%s/%s:rebuild", seg(args[0]), seg(args[1]))
				body := map[string]any{"time": *at, "snapshot": *snapshot, "aggregateType": *aggType, "dryRun": *dry}
				if !*fromHistory {
					return c.do(ctx, "POST", path, body, renderKV)
				}
				body["history"], body["database"] = true, *database
				if *rate != 0 {
					body["rate"] = *rate
				}
				var raw json.RawMessage
				if err := c.call(ctx, "POST", path, body, &raw); err != nil {
					return err
				}
				if err := c.show(raw, renderKV); err != nil || *dry {
					return err
				}
				var started struct{ Backfills []struct{ ID string } }
				if err := json.Unmarshal(raw, &started); err != nil {
					return err
				}
				for _, b := range started.Backfills {
					if err := driveBackfill(ctx, c, b.ID); err != nil {
						return err
					}
				}
				return nil
			}
		}},
	{path: []string{"consumers", "audit"}, short: "who changed the registry, when, and what",
		setup: func(fs *flag.FlagSet) runner {
			topic := fs.String("topic", "", "one topic's changes")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				return c.do(ctx, "GET", "/audit"+query("action", "consumer.", "topic", *topic), nil, renderAudit)
			}
		}},
	{path: []string{"gaps", "ls"}, args: "TOPIC CONSUMER", short: "a strict consumer's open version gaps, oldest first (from its own database)",
		setup: func(fs *flag.FlagSet) runner {
			aggType := fs.String("aggregate-type", "", "one aggregate type")
			aggID := fs.String("aggregate", "", "one aggregate id")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "TOPIC", "CONSUMER"); err != nil {
					return err
				}
				return c.do(ctx, "GET", fmt.Sprintf("/consumers/%s/%s/gaps", seg(args[0]), seg(args[1]))+
					query("aggregateType", *aggType, "aggregateId", *aggID), nil, renderGaps)
			}
		}},
	{path: []string{"gaps", "skip"}, args: "TOPIC CONSUMER", short: "release a strict consumer's gap by skipping versions that will never come",
		setup: func(fs *flag.FlagSet) runner {
			aggType := fs.String("aggregate-type", "", "the aggregate type (may be left out when one type has a gap for the id)")
			aggID := fs.String("aggregate", "", "the aggregate id (required)")
			version := fs.Int64("version", 0, "the first missing version (required)")
			through := fs.Int64("through", 0, "the last version to skip, below the first parked one (default: --version alone)")
			reason := fs.String("reason", "", "why, for the audit log")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "TOPIC", "CONSUMER"); err != nil {
					return err
				}
				if *aggID == "" || *version < 1 {
					return usageError("give --aggregate and --version (the first missing version)")
				}
				return c.do(ctx, "POST", fmt.Sprintf("/consumers/%s/%s/gaps:skip", seg(args[0]), seg(args[1])),
					map[string]any{"aggregateType": *aggType, "aggregateId": *aggID, "version": *version, "through": *through, "reason": *reason}, renderKV)
			}
		}},
	{path: []string{"seek"}, args: "SUBSCRIPTION", short: "rewind a consumer's subscription to a time or a snapshot (redelivers what it retained)",
		setup: func(fs *flag.FlagSet) runner {
			at := fs.String("time", "", "seek to this time (RFC 3339)")
			snapshot := fs.String("snapshot", "", "seek to this snapshot")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "SUBSCRIPTION"); err != nil {
					return err
				}
				if (*at == "") == (*snapshot == "") {
					return usageError("give exactly one of --time and --snapshot")
				}
				return c.do(ctx, "POST", "/subscriptions/"+seg(args[0])+":seek", map[string]string{"time": *at, "snapshot": *snapshot}, renderKV)
			}
		}},
	{path: []string{"snapshots", "ls"}, short: "list Pub/Sub snapshots",
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				return c.do(ctx, "GET", "/snapshots", nil, renderSnapshots)
			}
		}},
	{path: []string{"snapshots", "create"}, args: "NAME SUBSCRIPTION", short: "snapshot a consumer's subscription (to seek back to later)",
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "NAME", "SUBSCRIPTION"); err != nil {
					return err
				}
				return c.do(ctx, "POST", "/snapshots", map[string]string{"name": args[0], "subscription": args[1]}, renderKV)
			}
		}},
	{path: []string{"whoami"}, short: "who the API sees you as, and whether you may write",
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				return c.do(ctx, "GET", "/whoami", nil, renderKV)
			}
		}},
}

func toggle(on bool) runner {
	verb := map[bool]string{true: "enable", false: "disable"}[on]
	return func(ctx context.Context, c *cli, args []string) error {
		if err := exactly(args, "TOPIC", "CONSUMER"); err != nil {
			return err
		}
		return c.do(ctx, "POST", fmt.Sprintf("/consumers/%s/%s:%s", seg(args[0]), seg(args[1]), verb), nil, renderConsumerChange)
	}
}

func pause(verb string) runner {
	return func(ctx context.Context, c *cli, args []string) error {
		if err := exactly(args, "TOPIC", "CONSUMER"); err != nil {
			return err
		}
		return c.do(ctx, "POST", fmt.Sprintf("/consumers/%s/%s:%s", seg(args[0]), seg(args[1]), verb), nil, renderKV)
	}
}
