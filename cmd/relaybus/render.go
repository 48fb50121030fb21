package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// call calls the API and decodes its answer into v.
func (c *cli) call(ctx context.Context, method, path string, body, v any) error {
	saved := c.output
	c.output = "table"
	defer func() { c.output = saved }()
	return c.do(ctx, method, path, body, func(_ io.Writer, b []byte) error { return json.Unmarshal(b, v) })
}

// The API's shapes, as far as the tables show them.
type (
	eventDoc struct {
		EventID, EventType, Topic, AggregateID, Status, ParentEventID, TraceID, Source string
		Version                                                                        int64
		OccurredAt                                                                     time.Time
		RetryCount                                                                     int
		Consumed, Expected                                                             *int
		PayloadEncoding                                                                string
		Payload                                                                        json.RawMessage
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
		Outbox                        *struct {
			Database, State string
			Attempts        int
			LastError       string
		}
		Parent   *eventDoc
		Children []eventDoc
		Repush   *struct {
			Allowed       bool
			Code, Message string
		}
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
		consumed := ""
		if e.Consumed != nil && e.Expected != nil {
			consumed = fmt.Sprintf("%d/%d", *e.Consumed, *e.Expected)
		}
		rows = append(rows, []string{e.EventID, e.EventType, e.AggregateID, fmt.Sprint(e.Version), e.Status, consumed, e.OccurredAt.UTC().Format(time.RFC3339)})
	}
	if err := table(w, "EVENT\tTYPE\tAGGREGATE\tVERSION\tSTATUS\tCONSUMED\tOCCURRED", rows); err != nil {
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
	if d.Parent != nil {
		fmt.Fprintf(w, "parent %s %s\n", d.Parent.EventType, d.Parent.EventID)
	}
	for _, c := range d.Children {
		fmt.Fprintf(w, "child %s %s [%s]\n", c.EventType, c.EventID, c.Status)
	}
	if d.Outbox != nil {
		fmt.Fprintf(w, "outbox (%s): %s after %d attempts %s\n", d.Outbox.Database, d.Outbox.State, d.Outbox.Attempts, d.Outbox.LastError)
	}
	if e.PayloadEncoding != "" {
		fmt.Fprintf(w, "payload (%s): %s\n", e.PayloadEncoding, e.Payload)
	}
	if d.Repush != nil && !d.Repush.Allowed {
		fmt.Fprintf(w, "re-push: not allowed now (%s)\n", d.Repush.Code)
	}
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

func renderPlan(w io.Writer, b []byte) error {
	var p struct {
		DeadLetterID, Topic, Consumer, EventID, Outcome, Summary, MessageID string
		DryRun                                                              bool
		Checks                                                              []struct{ Check, Result string }
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if p.DryRun {
		fmt.Fprintf(w, "dry run: %s (%s)\n", p.Summary, p.Outcome)
	} else {
		fmt.Fprintf(w, "replayed %s to %s as message %s: %s\n", p.DeadLetterID, p.Consumer, p.MessageID, p.Summary)
	}
	for _, c := range p.Checks {
		fmt.Fprintf(w, "  %-8s %s\n", c.Check, c.Result)
	}
	return nil
}

func renderBatch(w io.Writer, b []byte) error {
	var r struct {
		Matched, Replayed, Remaining, SkippedNoConsumer int
		DryRun                                          bool
		ByTopicConsumer                                 []struct {
			Topic, Consumer string
			Count           int
		}
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	var rows [][]string
	for _, x := range r.ByTopicConsumer {
		rows = append(rows, []string{x.Topic, x.Consumer, fmt.Sprint(x.Count)})
	}
	if r.DryRun {
		fmt.Fprintf(w, "%d dead letter(s) match (run again with --yes to replay them, each to its consumer)\n", r.Matched)
	} else {
		fmt.Fprintf(w, "replayed %d of %d dead letter(s) (%d remaining, %d naming no consumer)\n", r.Replayed, r.Matched, r.Remaining, r.SkippedNoConsumer)
	}
	if len(rows) == 0 {
		return nil
	}
	return table(w, "TOPIC\tCONSUMER\tLETTERS", rows)
}

type consumerRow struct {
	Topic, ConsumerID, Description, UpdatedBy, Subscription, PubSubSubscription, Delivery, Owner string
	Enabled, InRegistry, Declared                                                                bool
}

func renderConsumers(w io.Writer, b []byte) error {
	var p struct {
		Consumers []consumerRow
		Ownership string
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	var rows [][]string
	for _, c := range p.Consumers {
		state := map[bool]string{true: "enabled", false: "disabled"}[c.Enabled]
		if !c.InRegistry {
			state = "not in registry"
		}
		sub := c.Subscription
		if c.PubSubSubscription != "" {
			sub += " (" + c.PubSubSubscription + ")"
		}
		if !c.Declared {
			sub = "(no subscription in the topology)"
		}
		rows = append(rows, []string{c.Topic, c.ConsumerID, state, c.Delivery, sub, c.Owner, c.UpdatedBy})
	}
	if err := table(w, "TOPIC\tCONSUMER\tSTATE\tDELIVERY\tSUBSCRIPTION\tOWNER\tCHANGED BY", rows); err != nil {
		return err
	}
	if p.Ownership != "" {
		fmt.Fprintln(w, "\n"+p.Ownership)
	}
	return nil
}

func renderConsumerChange(w io.Writer, b []byte) error {
	var r struct {
		Consumer consumerRow
		Changed  bool
		Warning  string
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	state := map[bool]string{true: "enabled", false: "disabled"}[r.Consumer.Enabled]
	if r.Changed {
		fmt.Fprintf(w, "%s on %s is now %s (events sent from now on; services cache the registry for up to 30s)\n", r.Consumer.ConsumerID, r.Consumer.Topic, state)
	} else {
		fmt.Fprintf(w, "%s on %s was already %s: nothing changed\n", r.Consumer.ConsumerID, r.Consumer.Topic, state)
	}
	if r.Warning != "" {
		fmt.Fprintln(w, "warning:", r.Warning)
	}
	return nil
}

func renderAudit(w io.Writer, b []byte) error {
	var p struct {
		Entries []struct {
			At                                time.Time
			By, Action, Topic, ConsumerID, ID string
			Detail                            string
		}
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	var rows [][]string
	for _, e := range p.Entries {
		rows = append(rows, []string{e.At.UTC().Format(time.RFC3339), e.By, e.Action, e.Topic, e.ConsumerID, e.Detail})
	}
	return table(w, "AT\tBY\tACTION\tTOPIC\tCONSUMER\tWHAT", rows)
}

func renderSnapshots(w io.Writer, b []byte) error {
	var p struct {
		Snapshots []struct{ Name, Topic, ExpireTime string }
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	var rows [][]string
	for _, s := range p.Snapshots {
		rows = append(rows, []string{s.Name, s.Topic, s.ExpireTime})
	}
	return table(w, "SNAPSHOT\tTOPIC\tEXPIRES", rows)
}

func renderOverview(w io.Writer, b []byte) error {
	var o struct {
		Window      string
		Counts      map[string]int64
		DeadLetters *struct {
			Total           int
			ByTopicConsumer []struct {
				Topic, Consumer string
				Count           int
			}
		}
		Outbox map[string]struct{ Pending, Failed int }
		Lag    *struct {
			Events int
			Hops   []struct {
				Hop          string
				Count        int
				P50Ms, P95Ms float64
				MaxMs        float64
			}
		}
		Unavailable []string
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return err
	}
	var parts []string
	for _, s := range []string{"PENDING", "SENT", "CONSUMED", "PARTIAL", "FAILED", "RETRYING", "EXPIRED"} {
		parts = append(parts, fmt.Sprintf("%s %d", s, o.Counts[s]))
	}
	fmt.Fprintf(w, "events of the last %s: %s\n", o.Window, strings.Join(parts, ", "))
	if o.DeadLetters != nil {
		fmt.Fprintf(w, "dead letters: %d\n", o.DeadLetters.Total)
		for _, x := range o.DeadLetters.ByTopicConsumer {
			fmt.Fprintf(w, "  %s  %s  %d\n", x.Topic, x.Consumer, x.Count)
		}
	}
	dbs := make([]string, 0, len(o.Outbox))
	for k := range o.Outbox {
		dbs = append(dbs, k)
	}
	sort.Strings(dbs)
	for _, k := range dbs {
		fmt.Fprintf(w, "outbox %s: %d pending, %d failed\n", k, o.Outbox[k].Pending, o.Outbox[k].Failed)
	}
	if o.Lag != nil {
		var rows [][]string
		for _, h := range o.Lag.Hops {
			rows = append(rows, []string{h.Hop, fmt.Sprint(h.Count), ms(h.P50Ms), ms(h.P95Ms), ms(h.MaxMs)})
		}
		fmt.Fprintf(w, "lag over the last hour (%d events):\n", o.Lag.Events)
		if err := table(w, "HOP\tEVENTS\tP50\tP95\tMAX", rows); err != nil {
			return err
		}
	}
	if len(o.Unavailable) > 0 {
		fmt.Fprintln(w, "unavailable:", strings.Join(o.Unavailable, ", "))
	}
	return nil
}

func ms(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.1fs", v/1000)
	}
	return fmt.Sprintf("%.0fms", v)
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
		v := m[k]
		if sub, ok := v.(map[string]any); ok {
			b, _ := json.Marshal(sub)
			v = string(b)
		}
		rows = append(rows, []string{k, fmt.Sprint(v)})
	}
	return table(w, "FIELD\tVALUE", rows)
}

func renderGaps(w io.Writer, b []byte) error {
	var p struct {
		Gaps []struct {
			AggregateType, AggregateID, Age string
			Applied, Missing, FirstParked   int64
			Parked                          int
			Overdue                         bool
		}
		GapTimeout string
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	var rows [][]string
	for _, g := range p.Gaps {
		missing := fmt.Sprint(g.Missing)
		if g.FirstParked-1 > g.Missing {
			missing = fmt.Sprintf("%d..%d", g.Missing, g.FirstParked-1)
		}
		rows = append(rows, []string{g.AggregateType, g.AggregateID, fmt.Sprint(g.Applied), missing, fmt.Sprint(g.Parked), g.Age,
			map[bool]string{true: "overdue (gap timeout " + p.GapTimeout + ")", false: ""}[g.Overdue]})
	}
	return table(w, "TYPE\tAGGREGATE\tAPPLIED\tMISSING\tPARKED\tAGE\tSTATE", rows)
}
