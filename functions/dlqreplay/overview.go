package dlqreplay

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	ledgerquery "github.com/relaybus/relaybus/internal/ledger/query"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/percentile"
	"github.com/relaybus/relaybus/shared/outbox"
)

// The overview's bounds.
const (
	// LagWindow is how far back the lag chart looks.
	LagWindow = time.Hour
	// lagEvents is how many of the window's newest events the lag is
	// computed from; lagAttempts how many of them have their attempts read
	// (one query each) for the consumers' commits.
	lagEvents   = 500
	lagAttempts = 100
	// overviewTTL is how long an overview is reused: every open console
	// polls it.
	overviewTTL = 3 * time.Second
)

// Hop names, in delivery order.
const (
	HopPublish = "commit → published"
	HopConsume = "published → consumer commit"
	HopStatus  = "consumer commit → final status"
	HopTotal   = "commit → final status"
)

// hopStats summarizes one hop's latencies, in milliseconds.
type hopStats struct {
	Hop   string  `json:"hop"`
	Count int     `json:"count"`
	P50   float64 `json:"p50Ms"`
	P95   float64 `json:"p95Ms"`
	Max   float64 `json:"maxMs"`
}

// lagPoint is one minute of the chart: each hop's median in milliseconds
// (absent when no event of that minute passed the hop).
type lagPoint struct {
	Minute time.Time          `json:"minute"`
	P50    map[string]float64 `json:"p50Ms"`
}

type overviewView struct {
	GeneratedAt time.Time `json:"generatedAt"`
	// Window is the status counts' window.
	Window      string                 `json:"window"`
	Counts      map[model.Status]int64 `json:"counts"`
	DeadLetters *archive.Summary       `json:"deadLetters"`
	// Outbox is each reachable outbox's backlog, by database.
	Outbox map[string]outbox.Counts `json:"outbox"`
	Lag    *lagView                 `json:"lag"`
	// Unavailable names the sections that could not be read.
	Unavailable []string `json:"unavailable,omitempty"`
}

type lagView struct {
	Window string `json:"window"`
	// Events is how many events the figures come from.
	Events int `json:"events"`
	// Hops summarize each hop; Consumers split HopConsume by consumer.
	Hops      []hopStats `json:"hops"`
	Consumers []hopStats `json:"consumers"`
	Series    []lagPoint `json:"series"`
	// MissingEnqueuedAt counts events the ledger recorded without their
	// outbox commit time (the first hop is unknown for them).
	MissingEnqueuedAt int `json:"missingEnqueuedAt"`
}

// overview serves GET /overview: events by status, dead letters per
// topic and consumer, each outbox's backlog and the lag of each hop, read
// at most once per overviewTTL (every open console polls it).
type overview struct {
	reader      *ledgerquery.Reader
	deadLetters *archive.Store
	// dbs are the outboxes whose backlog is counted.
	dbs    databases
	logger *slog.Logger
	cache  overviewCache
}

// overviewCache keeps the last overview for overviewTTL.
type overviewCache struct {
	mu   sync.Mutex
	at   time.Time
	key  string
	view *overviewView
}

func (ov *overview) get(r *request, _ []string) (any, error) {
	q := newQuery(r.Request, "window")
	window := q.duration("window", 24*time.Hour)
	if err := q.err(); err != nil {
		return nil, err
	}
	key := window.String()
	cache := &ov.cache
	cache.mu.Lock()
	if cache.view != nil && cache.key == key && time.Since(cache.at) < overviewTTL && cache.view.GeneratedAt.After(time.Now().Add(-overviewTTL)) {
		v := cache.view
		cache.mu.Unlock()
		return v, nil
	}
	cache.mu.Unlock()
	v := ov.build(r.Context(), window)
	cache.mu.Lock()
	cache.at, cache.key, cache.view = time.Now(), key, v
	cache.mu.Unlock()
	return v, nil
}

func (ov *overview) build(ctx context.Context, window time.Duration) *overviewView {
	now := time.Now().UTC()
	v := &overviewView{GeneratedAt: now, Window: shortDuration(window), Outbox: map[string]outbox.Counts{}}
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	down := func(section string, err error) {
		ov.logger.WarnContext(ctx, "dlqreplay: overview section unavailable", "section", section, "error", err.Error())
		mu.Lock()
		v.Unavailable = append(v.Unavailable, section)
		mu.Unlock()
	}
	wg.Add(4)
	go func() {
		defer wg.Done()
		c, err := ov.reader.StatusCounts(ctx, now.Add(-window))
		if err != nil {
			down("counts", err)
			return
		}
		v.Counts = c
	}()
	go func() {
		defer wg.Done()
		s, err := ov.deadLetters.Summarize(ctx, archive.Filter{})
		if err != nil {
			down("deadLetters", err)
			return
		}
		v.DeadLetters = &s
	}()
	go func() {
		defer wg.Done()
		dbs := ov.dbs.all()
		for _, name := range sortedKeys(dbs) {
			c, err := outbox.Count(ctx, dbs[name])
			if err != nil {
				down("outbox:"+name, err)
				continue
			}
			mu.Lock()
			v.Outbox[name] = c
			mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		hops, err := ov.reader.RecentHops(ctx, now.Add(-LagWindow), lagEvents, lagAttempts)
		if err != nil {
			down("lag", err)
			return
		}
		v.Lag = lagOf(hops)
	}()
	wg.Wait()
	sort.Strings(v.Unavailable)
	return v
}

// lagOf turns hop times into per-hop statistics and a per-minute series.
func lagOf(events []ledgerquery.Hops) *lagView {
	lv := &lagView{Window: shortDuration(LagWindow), Events: len(events), Hops: []hopStats{}, Consumers: []hopStats{}, Series: []lagPoint{}}
	all := map[string][]float64{}
	byConsumer := map[string][]float64{}
	perMinute := map[time.Time]map[string][]float64{}
	ms := func(from, to time.Time) (float64, bool) {
		if from.IsZero() || to.IsZero() {
			return 0, false
		}
		return max(float64(to.Sub(from).Microseconds())/1000, 0), true
	}
	for _, h := range events {
		minute := h.OccurredAt.UTC().Truncate(time.Minute)
		add := func(hop string, v float64) {
			all[hop] = append(all[hop], v)
			if perMinute[minute] == nil {
				perMinute[minute] = map[string][]float64{}
			}
			perMinute[minute][hop] = append(perMinute[minute][hop], v)
		}
		if h.EnqueuedAt.IsZero() {
			lv.MissingEnqueuedAt++
		}
		if d, ok := ms(h.EnqueuedAt, h.SentAt); ok {
			add(HopPublish, d)
		}
		var last time.Time
		for _, c := range h.Consumers {
			if d, ok := ms(h.SentAt, c.CommittedAt); ok {
				add(HopConsume, d)
				byConsumer[c.ConsumerID] = append(byConsumer[c.ConsumerID], d)
			}
			if c.CommittedAt.After(last) {
				last = c.CommittedAt
			}
		}
		if h.Status == model.StatusConsumed {
			if d, ok := ms(last, h.StatusAt); ok {
				add(HopStatus, d)
			}
			start := h.EnqueuedAt
			if start.IsZero() {
				start = h.OccurredAt
			}
			if d, ok := ms(start, h.StatusAt); ok {
				add(HopTotal, d)
			}
		}
	}
	for _, hop := range []string{HopPublish, HopConsume, HopStatus, HopTotal} {
		lv.Hops = append(lv.Hops, stats(hop, all[hop]))
	}
	for _, c := range sortedKeys(byConsumer) {
		lv.Consumers = append(lv.Consumers, stats(c, byConsumer[c]))
	}
	minutes := make([]time.Time, 0, len(perMinute))
	for m := range perMinute {
		minutes = append(minutes, m)
	}
	sort.Slice(minutes, func(i, j int) bool { return minutes[i].Before(minutes[j]) })
	for _, m := range minutes {
		p := lagPoint{Minute: m, P50: map[string]float64{}}
		for hop, vs := range perMinute[m] {
			p.P50[hop] = percentile.Of(vs, 0.5)
		}
		lv.Series = append(lv.Series, p)
	}
	return lv
}

func stats(name string, vs []float64) hopStats {
	s := hopStats{Hop: name, Count: len(vs)}
	if len(vs) == 0 {
		return s
	}
	s.P50, s.P95 = percentile.Of(vs, 0.5), percentile.Of(vs, 0.95)
	for _, v := range vs {
		s.Max = max(s.Max, v)
	}
	return s
}

// shortDuration writes 24h rather than 24h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
