package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"
)

// jobCommands are the replay jobs' commands (the API's POST /replays,
// GET /jobs, POST /jobs/{id}:cancel); commands lists them.
var jobCommands = []*command{
	{path: []string{"replay"}, short: "replay every event of a topic one consumer failed or dead-lettered in a window, to it alone, as a job (counts first)",
		setup: func(fs *flag.FlagSet) runner {
			topic := fs.String("topic", "", "the topic (required)")
			consumer := fs.String("consumer", "", "the consumer that failed them (required)")
			since := fs.String("since", "", "published at or after (RFC 3339, required)")
			until := fs.String("until", "", "published before (RFC 3339, required)")
			outcome := fs.String("outcome", "", "failed (re-pushed through the outbox) or dead_lettered (its dead letter replayed) (required)")
			class := fs.String("error-class", "", "transient, permanent or poison")
			code := fs.String("error-code", "", "the error code the consumer recorded, e.g. timeout")
			rate := fs.Float64("rate", 0, "events per second, 0.1 to 100 (default 10)")
			dry := fs.Bool("dry-run", false, "only count the events and show a sample; send nothing")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				if *topic == "" || *consumer == "" || *since == "" || *until == "" || *outcome == "" {
					return usageError("give --topic, --consumer, --since, --until and --outcome")
				}
				for name, v := range map[string]string{"since": *since, "until": *until} {
					if err := timeFlag(name, v); err != nil {
						return err
					}
				}
				body := map[string]any{"topic": *topic, "consumer": *consumer, "since": *since, "until": *until, "outcome": *outcome,
					"errorClass": *class, "errorCode": *code, "dryRun": true}
				if *rate != 0 {
					body["rate"] = *rate
				}
				if *dry {
					return c.do(ctx, "POST", "/replays", body, renderReplayCount)
				}
				// The job sends what the count said, or nothing.
				var count struct{ Matched int }
				if err := c.call(ctx, "POST", "/replays", body, &count); err != nil {
					return err
				}
				body["dryRun"], body["expect"] = false, count.Matched
				var j job
				if err := c.call(ctx, "POST", "/replays", body, &j); err != nil {
					return err
				}
				return drive(ctx, c, j.ID)
			}
		}},
	{path: []string{"jobs", "run"}, args: "JOB_ID", short: "drive a replay job until it ends (a job advances while a caller drives it; Ctrl-C pauses it)",
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "JOB_ID"); err != nil {
					return err
				}
				return drive(ctx, c, args[0])
			}
		}},
	{path: []string{"jobs", "show"}, args: "JOB_ID", short: "one replay job's progress: matched, sent, failed, remaining, rate, ETA",
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "JOB_ID"); err != nil {
					return err
				}
				return c.do(ctx, "GET", "/jobs/"+seg(args[0]), nil, renderJob)
			}
		}},
	{path: []string{"jobs", "cancel"}, args: "JOB_ID", short: "cancel a running replay job: it sends nothing more",
		setup: func(fs *flag.FlagSet) runner {
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args, "JOB_ID"); err != nil {
					return err
				}
				return c.do(ctx, "POST", "/jobs/"+seg(args[0])+":cancel", nil, renderJob)
			}
		}},
	{path: []string{"jobs"}, short: "the replay jobs, newest first, with their progress",
		setup: func(fs *flag.FlagSet) runner {
			state := fs.String("state", "", "running, done or cancelled")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				return c.do(ctx, "GET", "/jobs"+query("state", *state), nil, renderJobs)
			}
		}},
}

// drive calls POST /jobs/{id}:run until the job ends (or another caller
// drives it), printing its progress after each slice (tables only), then
// the job.
func drive(ctx context.Context, c *cli, id string) error {
	for {
		var j job
		if err := c.call(ctx, "POST", "/jobs/"+seg(id)+":run", nil, &j); err != nil {
			return err
		}
		if j.State != "running" || j.Busy {
			return c.do(ctx, "GET", "/jobs/"+seg(id), nil, renderJob)
		}
		if c.output != "table" {
			continue
		}
		fmt.Fprintf(c.out, "job %s: %d/%d sent, %d failed, %d remaining, eta %s\n", j.ID, j.Sent, j.Matched, j.Failed, j.Remaining, j.eta())
	}
}

// job is a replay job as the API answers it.
type job struct {
	ID     string
	Filter struct {
		Topic, Consumer, Outcome, ErrorClass, ErrorCode string
		Since, Until                                    time.Time
	}
	State, CreatedBy, CancelledBy, LastError  string
	Rate, MeasuredRate, ETASeconds            float64
	Matched, Sent, Failed, Skipped, Remaining int
	CreatedAt                                 time.Time
	Busy                                      bool
}

func (j job) filter() string {
	s := fmt.Sprintf("%s of %s, %s %s..%s", j.Filter.Outcome, j.Filter.Consumer, j.Filter.Topic,
		j.Filter.Since.Format(time.RFC3339), j.Filter.Until.Format(time.RFC3339))
	if j.Filter.ErrorClass != "" {
		s += " class " + j.Filter.ErrorClass
	}
	if j.Filter.ErrorCode != "" {
		s += " code " + j.Filter.ErrorCode
	}
	return s
}

func (j job) eta() string {
	if j.State != "running" || j.MeasuredRate == 0 {
		return "-"
	}
	return (time.Duration(j.ETASeconds) * time.Second).String()
}

func renderReplayCount(w io.Writer, b []byte) error {
	var r struct {
		Matched, Scanned int
		Rate             float64
		Via              string
		Sample           []struct {
			EventID, Outcome, ErrorCode string
			OccurredAt                  time.Time
			AttemptNo                   int
		}
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d event(s) match (of %d read); run again without --dry-run to send them by %s at %g/s\n", r.Matched, r.Scanned, r.Via, r.Rate)
	if len(r.Sample) == 0 {
		return nil
	}
	var rows [][]string
	for _, s := range r.Sample {
		rows = append(rows, []string{s.EventID, s.OccurredAt.Format(time.RFC3339), s.Outcome, s.ErrorCode, fmt.Sprint(s.AttemptNo)})
	}
	return table(w, "EVENT\tOCCURRED\tOUTCOME\tCODE\tATTEMPT", rows)
}

func renderJob(w io.Writer, b []byte) error {
	var j job
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	rows := [][]string{
		{"job", j.ID}, {"state", j.State}, {"filter", j.filter()}, {"by", j.CreatedBy},
		{"matched", fmt.Sprint(j.Matched)}, {"sent", fmt.Sprint(j.Sent)}, {"failed", fmt.Sprint(j.Failed)},
		{"skipped", fmt.Sprint(j.Skipped)}, {"remaining", fmt.Sprint(j.Remaining)},
		{"rate", fmt.Sprintf("%.1f/s (limit %g/s)", j.MeasuredRate, j.Rate)}, {"eta", j.eta()},
	}
	if j.CancelledBy != "" {
		rows = append(rows, []string{"cancelled by", j.CancelledBy})
	}
	if j.LastError != "" {
		rows = append(rows, []string{"last error", j.LastError})
	}
	if j.State == "running" {
		rows = append(rows, []string{"progress", "relaybus jobs show " + j.ID + "; cancel: relaybus jobs cancel " + j.ID})
	}
	return table(w, "FIELD\tVALUE", rows)
}

func renderJobs(w io.Writer, b []byte) error {
	var r struct{ Jobs []job }
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	if len(r.Jobs) == 0 {
		fmt.Fprintln(w, "no replay jobs")
		return nil
	}
	var rows [][]string
	for _, j := range r.Jobs {
		rows = append(rows, []string{j.ID, j.State, j.filter(), fmt.Sprintf("%d/%d", j.Sent, j.Matched), fmt.Sprint(j.Failed),
			fmt.Sprint(j.Remaining), fmt.Sprintf("%.1f/s", j.MeasuredRate), j.eta()})
	}
	return table(w, "JOB\tSTATE\tFILTER\tSENT\tFAILED\tREMAINING\tRATE\tETA", rows)
}

// The replay jobs' commands follow the others in help.
func init() { commands = append(commands, jobCommands...) }
