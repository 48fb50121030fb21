package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/fsopen"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/ledger/query"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/percentile"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// LoadTopic is the topic the load generator publishes to: the demo's
// order.purchased events, consumed by member-service (push) and
// message-service (Eventarc).
const LoadTopic = "shop.order.events"

// LoadOptions configure a load run.
type LoadOptions struct {
	// URL is the stack's base URL (Info.URL).
	URL string
	// Rate is the publish rate, requests per second (200).
	Rate float64
	// Duration is how long to publish (60 s).
	Duration time.Duration
	// Members spreads the orders over this many members (100), whose points
	// the run can check exactly.
	Members int
	// Run names the run: event ids are load-<run>-<n>, members
	// m-<run>-<k>, the initiator service load-<run> ("" picks one).
	Run string
	// Timeout bounds each request (30 s).
	Timeout time.Duration
	// MaxOpen bounds the requests open at once (5000); a request due while
	// that many are open is skipped and counted, never sent late.
	MaxOpen int
}

// LoadRequest is one scheduled publish and its outcome.
type LoadRequest struct {
	ID     string
	Member string
	Amount int64
	// At is the request's scheduled send time: latencies run from it (open
	// loop), never from when the client got round to it.
	At time.Time
	// Status is the HTTP status (0: no answer; Err says why).
	Status int
	Err    string
	// Answered is when the answer arrived.
	Answered time.Time
	// Skipped: the client had MaxOpen requests open when this one was due.
	Skipped bool
}

// Accepted reports whether publish took the event (202).
func (r *LoadRequest) Accepted() bool { return r.Status == http.StatusAccepted }

// LoadRun is a load run in progress or done.
type LoadRun struct {
	Options LoadOptions
	// Requests are every scheduled request, in schedule order; an entry is
	// final once Done is closed.
	Requests []*LoadRequest
	// Done is closed when every request has its outcome.
	Done chan struct{}

	sent, accepted, refused, open, skipped atomic.Int64
	mu                                     sync.Mutex
}

// StartLoad starts publishing order.purchased events at o.Rate for
// o.Duration, open loop: each request leaves at its scheduled time in its
// own goroutine (at most MaxOpen at once), whatever the answers of the
// earlier ones. It returns at once; the run ends by itself or when ctx
// ends.
func StartLoad(ctx context.Context, o LoadOptions) *LoadRun {
	if o.Rate <= 0 {
		o.Rate = 200
	}
	if o.Duration <= 0 {
		o.Duration = 60 * time.Second
	}
	if o.Members <= 0 {
		o.Members = 100
	}
	if o.Run == "" {
		o.Run = event.NewID()[:8]
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.MaxOpen <= 0 {
		o.MaxOpen = 5000
	}
	n := int(o.Rate * o.Duration.Seconds())
	lr := &LoadRun{Options: o, Done: make(chan struct{}), Requests: make([]*LoadRequest, n)}
	for i := range n {
		lr.Requests[i] = &LoadRequest{
			ID:     fmt.Sprintf("load-%s-%06d", o.Run, i),
			Member: fmt.Sprintf("m-%s-%03d", o.Run, i%o.Members),
			Amount: int64(10 + i%7),
		}
	}
	client := &http.Client{Timeout: o.Timeout, Transport: &http.Transport{
		MaxIdleConns: 2048, MaxIdleConnsPerHost: 2048, IdleConnTimeout: 30 * time.Second,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}}
	go func() {
		defer close(lr.Done)
		var wg sync.WaitGroup
		begin := time.Now()
		for i, r := range lr.Requests {
			at := begin.Add(time.Duration(float64(i) / o.Rate * float64(time.Second)))
			if sleep(ctx, time.Until(at)) != nil {
				for _, r := range lr.Requests[i:] {
					r.At, r.Skipped, r.Err = at, true, "run cancelled"
				}
				break
			}
			lr.mu.Lock()
			r.At = at
			lr.mu.Unlock()
			if lr.open.Load() >= int64(o.MaxOpen) {
				lr.mu.Lock()
				r.Skipped, r.Err = true, fmt.Sprintf("%d requests open", o.MaxOpen)
				lr.mu.Unlock()
				lr.skipped.Add(1)
				continue
			}
			lr.open.Add(1)
			lr.sent.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer lr.open.Add(-1)
				status, err := lr.publish(ctx, client, r)
				lr.mu.Lock()
				r.Status, r.Answered = status, time.Now()
				if err != nil {
					r.Err = err.Error()
				}
				lr.mu.Unlock()
				if status == http.StatusAccepted {
					lr.accepted.Add(1)
				} else {
					lr.refused.Add(1)
				}
			}()
		}
		wg.Wait()
	}()
	return lr
}

func (lr *LoadRun) publish(ctx context.Context, client *http.Client, r *LoadRequest) (int, error) {
	o := lr.Options
	order := strings.TrimPrefix(r.ID, "load-")
	body, _ := json.Marshal(map[string]any{
		"eventId": r.ID, "eventType": "order.purchased", "topic": LoadTopic, "aggregateType": "order",
		"aggregateId": "order-" + order, "version": 1, "source": "order-service",
		"payload":   map[string]any{"orderId": "order-" + order, "memberId": r.Member, "amount": r.Amount},
		"initiator": map[string]any{"service": "load-" + o.Run, "operation": "load"},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.URL+"/publish", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return 0, errors.New("timeout")
		}
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// Counts returns the requests sent so far, accepted, refused (answered
// otherwise or not at all), open, and skipped.
func (lr *LoadRun) Counts() (sent, accepted, refused, open, skipped int64) {
	return lr.sent.Load(), lr.accepted.Load(), lr.refused.Load(), lr.open.Load(), lr.skipped.Load()
}

// snapshot copies the requests (safe while the run goes on).
func (lr *LoadRun) snapshot() []LoadRequest {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	out := make([]LoadRequest, len(lr.Requests))
	for i, r := range lr.Requests {
		out[i] = *r
	}
	return out
}

// Observer reads what became of a load run's events: the outbox, each
// consumer's inbox and projections, and the ledger.
type Observer struct {
	// Main is the stack's main database (the publish function's outbox).
	Main *pgxpool.Pool
	// Consumers are the load topic's enabled consumers, with the database
	// that holds each one's inbox.
	Consumers []ObservedConsumer
	Ledger    *ledger.Store
	pools     []*pgxpool.Pool
	outboxes  []*pgxpool.Pool // one per database
}

// ObservedConsumer is one consumer of the load topic.
type ObservedConsumer struct {
	Service  string
	Delivery string
	DB       *pgxpool.Pool
	// DBName is the topology's database name, and DBSource where its URL
	// came from.
	DBName, DBSource string
}

// Observe connects to a running stack's databases (Info.Databases, else
// each database's DATABASE_URL_<NAME>) and ledger.
func Observe(ctx context.Context, info Info, top *topology.Topology) (*Observer, error) {
	ob := &Observer{}
	open := func(url string) (*pgxpool.Pool, error) {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = 8
		cfg.ConnConfig.RuntimeParams["application_name"] = observerApp // left out of connection counts
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		ob.pools = append(ob.pools, p)
		return p, nil
	}
	main, err := open(info.DatabaseURL)
	if err != nil {
		ob.Close()
		return nil, fmt.Errorf("database: %w", err)
	}
	ob.Main = main
	byURL := map[string]*pgxpool.Pool{info.DatabaseURL: main}
	for _, c := range top.Consumers() {
		if c.Topic != LoadTopic || !c.IsEnabled() {
			continue
		}
		oc := ObservedConsumer{Service: c.Service, Delivery: c.Delivery, DB: main, DBName: c.Database, DBSource: "database main"}
		if info.ConsumersPull {
			oc.Delivery = "pull" // a broker without push: every consumer pulls
		}
		if c.Database != "" && c.Database != topology.MainDatabase {
			url, src := info.Databases[c.Database], "database "+c.Database
			if url == "" {
				env := topology.Database{Name: c.Database}.EnvVar()
				url, src = os.Getenv(env), env
			}
			if url == "" {
				ob.Close()
				return nil, fmt.Errorf("%s: the stack names no URL for database %s", c.Service, c.Database)
			}
			if p, ok := byURL[url]; ok {
				oc.DB = p
			} else {
				p, err := open(url)
				if err != nil {
					ob.Close()
					return nil, fmt.Errorf("%s (%s): %w", c.Service, src, err)
				}
				byURL[url], oc.DB = p, p
			}
			oc.DBSource = src
		}
		ob.Consumers = append(ob.Consumers, oc)
	}
	// Every outbox: the stack's other databases hold child events.
	for _, name := range slices.Sorted(maps.Keys(info.Databases)) {
		url := info.Databases[name]
		if _, ok := byURL[url]; !ok {
			p, err := open(url)
			if err != nil {
				ob.Close()
				return nil, fmt.Errorf("database %s: %w", name, err)
			}
			byURL[url] = p
		}
	}
	for _, p := range byURL {
		ob.outboxes = append(ob.outboxes, p)
	}
	store, err := stackLedger(ctx, info)
	if err != nil {
		ob.Close()
		return nil, fmt.Errorf("ledger: %w", err)
	}
	ob.Ledger = store
	return ob, nil
}

// Close closes the observer's connections.
func (ob *Observer) Close() {
	for _, p := range ob.pools {
		p.Close()
	}
	if ob.Ledger != nil {
		_ = ob.Ledger.Close()
	}
}

// Written returns which of ids are in the main outbox (the event exists),
// with whether each is published.
func (ob *Observer) Written(ctx context.Context, ids []string) (map[string]bool, error) {
	// An aggregate's versions up to its dispatch row's published_version
	// are on Pub/Sub.
	rows, err := ob.Main.Query(ctx, `SELECT o.id, o.version <= coalesce(d.published_version, 0)
		FROM relaybus_outbox o LEFT JOIN relaybus_outbox_dispatch d USING (aggregatetype, aggregateid)
		WHERE o.id = ANY($1)`, ids)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for rows.Next() {
		var id string
		var pub bool
		if err := rows.Scan(&id, &pub); err != nil {
			return nil, err
		}
		out[id] = pub
	}
	return out, rows.Err()
}

// Unpublished counts the rows of every outbox that are not published
// (child events included; the operators' relaybus_outbox_backlog view),
// and those of them behind a FAILED head.
func (ob *Observer) Unpublished(ctx context.Context) (pending, failed int, err error) {
	for _, p := range ob.outboxes {
		var a, b int
		if err := p.QueryRow(ctx, `SELECT coalesce(sum(unpublished) FILTER (WHERE state <> 'failed'), 0),
			coalesce(sum(unpublished) FILTER (WHERE state = 'failed'), 0) FROM relaybus_outbox_backlog`).Scan(&a, &b); err != nil {
			return 0, 0, err
		}
		pending, failed = pending+a, failed+b
	}
	return pending, failed, nil
}

// Backlog describes up to limit aggregates of each outbox that have
// something unpublished (the relaybus_outbox_backlog view): state, head,
// attempts, last error, lease.
func (ob *Observer) Backlog(ctx context.Context, limit int) ([]string, error) {
	var out []string
	for _, p := range ob.outboxes {
		var db string
		if err := p.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
			return nil, err
		}
		rows, err := p.Query(ctx, `SELECT aggregatetype || '/' || aggregateid, state, unpublished, coalesce(head_event_id, ''),
			coalesce(head_version, 0), published_version, attempts, coalesce(last_error, ''),
			coalesce(to_char(next_attempt_at, 'HH24:MI:SS.MS'), '-'), coalesce(lease_owner, '-'),
			coalesce(to_char(lease_expires_at, 'HH24:MI:SS.MS'), '-')
			FROM relaybus_outbox_backlog ORDER BY head_event_id LIMIT $1`, limit)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var agg, state, head, lastErr, next, owner, leaseTo string
			var unpub, headV, pubV int64
			var attempts int
			if err := rows.Scan(&agg, &state, &unpub, &head, &headV, &pubV, &attempts, &lastErr, &next, &owner, &leaseTo); err != nil {
				rows.Close()
				return nil, err
			}
			out = append(out, fmt.Sprintf("%s: %s %s, %d unpublished from v%d (%s; published v%d), attempts %d, next %s, lease %s until %s, last error %q",
				db, agg, state, unpub, headV, head, pubV, attempts, next, owner, leaseTo, lastErr))
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Inbox returns, per consumer, when each of ids was applied: the commit
// time of the transaction that last wrote its inbox row (the delivery's
// own, which settles the row with its effect), read with
// pg_xact_commit_timestamp. It fails on a server without
// track_commit_timestamp (the stack's own cluster has it): the row's
// processed_at is now() at the transaction's start, earlier than the
// commit the latency must end at.
func (ob *Observer) Inbox(ctx context.Context, ids []string) (map[string]map[string]time.Time, error) {
	out := map[string]map[string]time.Time{}
	for _, c := range ob.Consumers {
		m := map[string]time.Time{}
		rows, err := c.DB.Query(ctx, `SELECT event_id, pg_xact_commit_timestamp(xmin) FROM relaybus_inbox WHERE consumer_id = $1 AND event_id = ANY($2)`, c.Service, ids)
		if err != nil {
			return nil, fmt.Errorf("%s inbox: %w", c.Service, err)
		}
		for rows.Next() {
			var id string
			var at time.Time
			if err := rows.Scan(&id, &at); err != nil {
				rows.Close()
				return nil, err
			}
			m[id] = at
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		out[c.Service] = m
	}
	return out, nil
}

// Percentiles are latency percentiles in milliseconds over N samples.
type Percentiles struct {
	N             int
	P50, P99, Max float64
}

func percentiles(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return Percentiles{N: len(ds), P50: ms(percentile.Sorted(ds, 0.5)), P99: ms(percentile.Sorted(ds, 0.99)), Max: ms(ds[len(ds)-1])}
}

// String is "p50 … ms  p99 … ms  max … ms  (n=…)", or "n/a" without samples.
func (p Percentiles) String() string {
	if p.N == 0 {
		return "n/a"
	}
	return fmt.Sprintf("p50 %s ms  p99 %s ms  max %s ms  (n=%d)", fmtMS(p.P50), fmtMS(p.P99), fmtMS(p.Max), p.N)
}

func fmtMS(v float64) string {
	if v >= 100 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// LoadReport is what a load run came to.
type LoadReport struct {
	Run               string
	Rate              float64
	Duration          time.Duration
	Scheduled, Sent   int
	Accepted, Skipped int
	Refused           map[string]int // by status or error
	Publish           Percentiles    // scheduled send → 202
	Written           int            // events in the outbox (accepted, or committed before their answer was lost)
	Delivered         map[string]int // per consumer, of the written events
	E2E               map[string]Percentiles
	Consumed          int // CONSUMED in the ledger
	LedgerLag         Percentiles
	EndToConsumed     Percentiles // scheduled send → CONSUMED statusAt
	Lost              []string    // accepted, not in the outbox
	Unpublished       []string    // written, not published
	NotDelivered      map[string][]string
	NotFinal          map[string][]string // by ledger status ("missing": no document)
	OutboxPending     int                 // unpublished rows in the outbox(es), children included
	OutboxFailed      int
	DrainedIn         time.Duration
	Consumers         []ObservedConsumer
}

// Stuck reports whether anything did not arrive where it should.
func (r LoadReport) Stuck() bool {
	if len(r.Lost)+len(r.Unpublished) > 0 || r.OutboxPending > 0 {
		return true
	}
	for _, v := range r.NotDelivered {
		if len(v) > 0 {
			return true
		}
	}
	for _, v := range r.NotFinal {
		if len(v) > 0 {
			return true
		}
	}
	return false
}

// Check compares a run with what the stack did: it waits up to drain for
// the run's events to be published, delivered to every consumer and
// final in the ledger (printing one line a second to progress, if set),
// then measures.
func (ob *Observer) Check(ctx context.Context, lr *LoadRun, drain time.Duration, progress io.Writer) (LoadReport, error) {
	reqs := lr.snapshot()
	ids := make([]string, 0, len(reqs))
	for _, r := range reqs {
		if !r.Skipped {
			ids = append(ids, r.ID)
		}
	}
	start := time.Now()
	deadline := start.Add(drain)
	var (
		written map[string]bool
		inbox   map[string]map[string]time.Time
		led     map[string]model.Event
		err     error
	)
	for {
		if written, err = ob.Written(ctx, ids); err != nil {
			return LoadReport{}, err
		}
		if inbox, err = ob.Inbox(ctx, ids); err != nil {
			return LoadReport{}, err
		}
		done := true
		for id := range written {
			for _, c := range ob.Consumers {
				if _, ok := inbox[c.Service][id]; !ok {
					done = false
				}
			}
		}
		final := 0
		if done || time.Now().After(deadline) {
			if led, err = query.New(ob.Ledger.Client()).Events(ctx, ids); err != nil {
				return LoadReport{}, err
			}
			for id := range written {
				if e, ok := led[id]; ok && e.Status == model.StatusConsumed {
					final++
				}
			}
			done = done && final == len(written)
		}
		if progress != nil {
			fmt.Fprintf(progress, "drain %3.0fs  written %d  %s  ledger CONSUMED %s\n", time.Since(start).Seconds(), len(written),
				deliveredLine(ob, inbox, written), ledgerCount(led, final))
		}
		if done || time.Now().After(deadline) {
			break
		}
		if sleep(ctx, time.Second) != nil {
			return LoadReport{}, ctx.Err()
		}
	}
	rep := LoadReport{Run: lr.Options.Run, Rate: lr.Options.Rate, Duration: lr.Options.Duration, Scheduled: len(reqs),
		Refused: map[string]int{}, Delivered: map[string]int{}, E2E: map[string]Percentiles{},
		NotDelivered: map[string][]string{}, NotFinal: map[string][]string{}, DrainedIn: time.Since(start), Consumers: ob.Consumers}
	var pub []time.Duration
	sched := map[string]time.Time{}
	for _, r := range reqs {
		sched[r.ID] = r.At
		switch {
		case r.Skipped:
			rep.Skipped++
			continue
		case r.Accepted():
			rep.Accepted++
			pub = append(pub, r.Answered.Sub(r.At))
			if _, ok := written[r.ID]; !ok {
				rep.Lost = append(rep.Lost, r.ID)
			}
		case r.Status != 0:
			rep.Refused[strconv.Itoa(r.Status)]++
		default:
			rep.Refused[shortErr(r.Err)]++
		}
		rep.Sent++
	}
	rep.Publish = percentiles(pub)
	rep.Written = len(written)
	for _, c := range ob.Consumers {
		var e2e []time.Duration
		for id, published := range written {
			at, ok := inbox[c.Service][id]
			if !ok {
				if published {
					rep.NotDelivered[c.Service] = append(rep.NotDelivered[c.Service], id)
				}
				continue
			}
			rep.Delivered[c.Service]++
			if r := reqs[indexOf(id)]; r.Accepted() {
				e2e = append(e2e, at.Sub(r.At))
			}
		}
		sort.Strings(rep.NotDelivered[c.Service])
		rep.E2E[c.Service] = percentiles(e2e)
	}
	var lag, toConsumed []time.Duration
	for id, pubd := range written {
		if !pubd {
			rep.Unpublished = append(rep.Unpublished, id)
		}
		e, ok := led[id]
		if !ok {
			rep.NotFinal["missing"] = append(rep.NotFinal["missing"], id)
			continue
		}
		if e.Status != model.StatusConsumed {
			rep.NotFinal[string(e.Status)] = append(rep.NotFinal[string(e.Status)], id)
			continue
		}
		rep.Consumed++
		var last time.Time
		all := true
		for _, c := range ob.Consumers {
			at, ok := inbox[c.Service][id]
			if !ok {
				all = false
			}
			if at.After(last) {
				last = at
			}
		}
		if all {
			lag = append(lag, e.StatusAt.Sub(last))
		}
		if r := reqs[indexOf(id)]; r.Accepted() {
			toConsumed = append(toConsumed, e.StatusAt.Sub(sched[id]))
		}
	}
	sort.Strings(rep.Unpublished)
	sort.Strings(rep.Lost)
	for k := range rep.NotFinal {
		sort.Strings(rep.NotFinal[k])
	}
	rep.LedgerLag = percentiles(lag)
	rep.EndToConsumed = percentiles(toConsumed)
	if rep.OutboxPending, rep.OutboxFailed, err = ob.Unpublished(ctx); err != nil {
		return rep, err
	}
	return rep, nil
}

// shortErr keeps the end of a client error ("connection refused",
// "EOF", "timeout"), dropping the URL and the addresses before it.
func shortErr(s string) string {
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

// indexOf is the request index of a load event id (load-<run>-<n>).
func indexOf(id string) int {
	n, _ := strconv.Atoi(id[strings.LastIndexByte(id, '-')+1:])
	return n
}

func deliveredLine(ob *Observer, inbox map[string]map[string]time.Time, written map[string]bool) string {
	var parts []string
	for _, c := range ob.Consumers {
		n := 0
		for id := range written {
			if _, ok := inbox[c.Service][id]; ok {
				n++
			}
		}
		parts = append(parts, fmt.Sprintf("%s %d", c.Service, n))
	}
	return "delivered " + strings.Join(parts, "  ")
}

func ledgerCount(led map[string]model.Event, final int) string {
	if led == nil {
		return "(checked once delivered)"
	}
	return strconv.Itoa(final)
}

// Print writes the report for a person.
func (r LoadReport) Print(w io.Writer) {
	fmt.Fprintf(w, "load: report for run %s (%g req/s for %v)\n", r.Run, r.Rate, r.Duration)
	refused := "none"
	if len(r.Refused) > 0 {
		var ks []string
		for _, k := range slices.Sorted(maps.Keys(r.Refused)) {
			ks = append(ks, fmt.Sprintf("%s ×%d", k, r.Refused[k]))
		}
		refused = strings.Join(ks, ", ")
	}
	fmt.Fprintf(w, "  requests      %d scheduled, %d sent, %d accepted (202), %d skipped (client at its open-request cap); refused: %s\n",
		r.Scheduled, r.Sent, r.Accepted, r.Skipped, refused)
	fmt.Fprintf(w, "  publish       %s  (scheduled send → 202)\n", r.Publish)
	fmt.Fprintf(w, "  written       %d events in the outbox (accepted %d)\n", r.Written, r.Accepted)
	for _, c := range r.Consumers {
		fmt.Fprintf(w, "  %-13s delivered %d/%d (%s; inbox in %s)\n", c.Service, r.Delivered[c.Service], r.Written, c.Delivery, c.DBSource)
		fmt.Fprintf(w, "    e2e         %s  (scheduled send → the consumer's commit)\n", r.E2E[c.Service])
	}
	fmt.Fprintf(w, "  ledger        %d/%d CONSUMED\n", r.Consumed, r.Written)
	fmt.Fprintf(w, "    lag         %s  (last consumer commit → CONSUMED statusAt)\n", r.LedgerLag)
	fmt.Fprintf(w, "    e2e         %s  (scheduled send → CONSUMED statusAt)\n", r.EndToConsumed)
	fmt.Fprintf(w, "  outbox        %d unpublished rows now (children included), %d FAILED\n", r.OutboxPending, r.OutboxFailed)
	fmt.Fprintf(w, "  drain         %v after the last request\n", r.DrainedIn.Round(time.Second))
	if !r.Stuck() {
		fmt.Fprintln(w, "  stuck         nothing")
		return
	}
	fmt.Fprintln(w, "  stuck:")
	list := func(what string, ids []string) {
		if len(ids) == 0 {
			return
		}
		show := ids
		if len(show) > 5 {
			show = show[:5]
		}
		more := ""
		if len(ids) > len(show) {
			more = fmt.Sprintf(" … (%d more)", len(ids)-len(show))
		}
		fmt.Fprintf(w, "    %-40s %6d  %s%s\n", what, len(ids), strings.Join(show, " "), more)
	}
	list("accepted but not in the outbox (lost)", r.Lost)
	list("in the outbox, unpublished", r.Unpublished)
	for _, c := range r.Consumers {
		list("published, not delivered to "+c.Service, r.NotDelivered[c.Service])
	}
	for _, k := range slices.Sorted(maps.Keys(r.NotFinal)) {
		list("not final in the ledger ("+k+")", r.NotFinal[k])
	}
	if r.OutboxPending > 0 {
		fmt.Fprintf(w, "    %-40s %6d\n", "outbox rows unpublished (all events)", r.OutboxPending)
	}
}

// stackLedger opens the stack's ledger as its functions do, on the
// emulator the stack names (not one the process environment may name).
func stackLedger(ctx context.Context, info Info) (*ledger.Store, error) {
	cfg := instance.Defaults[instance.Ledger]()
	cfg.EmulatorHost = info.FirestoreHost
	return fsopen.Ledger(ctx, cfg, info.Project, ledger.Options{})
}
