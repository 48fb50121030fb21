package consume

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/forward"
)

// HandlerForwarders is the CONSUMER_HANDLER of the one consume service
// that serves every forward consumer added at run time (internal/forwarders:
// the operators' API's POST /forwarders). Each is served under its name,
// POST /<name> (the push endpoint the API gives its subscription), by an
// engine of its own: its name as the consumer id (inbox, attempts, ledger),
// the forward handler with its URL, auth and timeout (an hmac forwarder
// signs with its secret, opened with RELAYBUS_FORWARDERS_KEY, and for
// forwarders.RotationOverlap after a rotation with the previous one too),
// its flow limits, and the pause by its own flag. The registry row is read again when the
// cached one is older than DefaultForwardersRefresh, and a new revision
// builds a new engine (the old one closes once its deliveries finish). A
// delivery for a name the registry lacks (a forwarder just removed; its
// subscription is deleted first) is acknowledged with code
// unknown_forwarder. POST /ledger:ship ships every forwarder's attempts,
// POST /inbox:purge purges the database's inbox, as for one consumer.
// On NATS JetStream, which pushes nothing, the service runs with
// CONSUMER_MODE=pull and pulls each forwarder's durable consumer into the
// same engine, one worker per forwarder (forwarders_pull.go).
//
// Each forwarder's circuit breaker pauses its own subscription while its
// target is down, as a declared forward consumer's over ordered push does
// (breakerpause.go): the subscription's push endpoint detached, recorded
// as the breaker's, so Pub/Sub delivers and counts nothing and keeps the
// messages in order. POST /breaker:probe (a Scheduler job, every minute)
// probes the target of every forwarder its breaker paused, once its
// cool-down has passed, and sets the endpoint back when the target answers.
const HandlerForwarders = "forwarders"

// DefaultForwardersRefresh is how long the forwarders service trusts its
// copy of a forwarder's registry row: a change made through the API
// reaches every instance within it.
const DefaultForwardersRefresh = 5 * time.Second

// CodeUnknownForwarder is the answer's code for a delivery to a name the
// forwarders' registry does not hold (acknowledged).
const CodeUnknownForwarder = "unknown_forwarder"

// forwarderSet routes each delivery to its forwarder's consume handler.
type forwarderSet struct {
	db consumer.DB
	// base is the engines' options but the consumer's own (id,
	// subscription, handler).
	base      consumer.Options
	fwd       HandlerConfig
	flowWait  time.Duration
	retention time.Duration
	refresh   time.Duration
	// pauseEvery is each forwarder's PauseEvery (Config.PauseEvery).
	pauseEvery time.Duration
	now        func() time.Time
	// push detaches and sets back a forwarder's push endpoint for its
	// breaker (nil: the broker has no push endpoints; the breaker holds
	// deliveries without pausing).
	push broker.PushConfigurer
	// keys open the hmac forwarders' signing secrets
	// (RELAYBUS_FORWARDERS_KEY).
	keys *forwarders.Keys

	mu      sync.Mutex
	entries map[string]*forwarderEntry
	closed  bool
	// retired are replaced engines still finishing their deliveries.
	retired sync.WaitGroup
}

type forwarderEntry struct {
	f       forwarders.Forwarder
	engine  *consumer.Engine
	h       *Handler
	checked time.Time
	// until, when set, is when the previous signing secret this engine
	// also signs with expires: the engine is built anew then.
	until time.Time
	busy  sync.WaitGroup
}

func newForwarderSet(base consumer.Options, fwd HandlerConfig, flowWait, retention time.Duration) *forwarderSet {
	return &forwarderSet{db: base.DB, base: base, fwd: fwd, flowWait: flowWait, retention: retention,
		refresh: DefaultForwardersRefresh, now: time.Now, entries: map[string]*forwarderEntry{}}
}

func (s *forwarderSet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method " + r.Method + " not allowed: deliveries are POSTed"})
		return
	}
	log := s.fwd.Logger
	p := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case strings.HasSuffix(p, "/ledger:ship"):
		s.ship(w, r)
		return
	case strings.HasSuffix(p, "/breaker:probe"):
		s.probe(w, r)
		return
	case strings.HasSuffix(p, "/inbox:purge"):
		n := 0
		for {
			d, err := inbox.Purge(r.Context(), s.db, s.now().Add(-s.retention), purgeBatch)
			n += d
			if err != nil {
				log.ErrorContext(r.Context(), "consume: inbox purge failed", "purged", n, "error", err.Error())
				writeJSON(w, http.StatusInternalServerError, map[string]any{"purged": n, "error": "the purge stopped early; see the logs"})
				return
			}
			if d == 0 {
				break
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"purged": n})
		return
	}
	name := p[strings.LastIndex(p, "/")+1:]
	if names.ValidateConsumer(name) != nil {
		log.ErrorContext(r.Context(), "consume: a delivery to the forwarders service names no forwarder; acknowledged", "path", r.URL.Path)
		writeJSON(w, http.StatusOK, consumer.Result{Code: CodeUnknownForwarder, Error: "the path names no forwarder: deliveries are POSTed to /<forwarder name>"})
		return
	}
	e, err := s.entry(r.Context(), name)
	switch {
	case errors.Is(err, forwarders.ErrNotFound):
		log.WarnContext(r.Context(), "consume: a delivery for a forwarder the registry does not hold; acknowledged", "forwarder", name)
		writeJSON(w, http.StatusOK, consumer.Result{Code: CodeUnknownForwarder, Error: "no forwarder is named " + name + ": it was removed"})
		return
	case err != nil:
		log.WarnContext(r.Context(), "consume: cannot serve a forwarder (its registry row unreadable, or its settings refused); redelivery requested",
			"forwarder", name, "error", err.Error())
		writeJSON(w, http.StatusServiceUnavailable, consumer.Result{Code: "unavailable", Error: "the forwarder cannot be served now; see the logs"})
		return
	}
	defer e.busy.Done()
	// The forwarder's own handler sees the delivery at its root: its
	// operator routes (gaps, ship, purge) are served above.
	r2 := r.Clone(r.Context())
	r2.URL.Path = "/"
	e.h.ServeHTTP(w, r2)
}

// entry returns name's handler, marked busy (the caller calls busy.Done):
// the cached one while its row is fresh, else the row read again, and a
// new engine built when its revision changed. ErrNotFound when the
// registry has no such forwarder.
func (s *forwarderSet) entry(ctx context.Context, name string) (*forwarderEntry, error) {
	s.mu.Lock()
	e := s.entries[name]
	if e != nil && s.now().Sub(e.checked) < s.refresh && !s.closed {
		e.busy.Add(1)
		s.mu.Unlock()
		return e, nil
	}
	s.mu.Unlock()
	f, err := forwarders.Get(ctx, s.db, name)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("consume: the forwarders service is shutting down")
	}
	e = s.entries[name]
	switch {
	case errors.Is(err, forwarders.ErrNotFound):
		if e != nil {
			delete(s.entries, name)
			s.retire(e)
		}
		return nil, err
	case err != nil && e != nil:
		// The registry is unreachable: the cached forwarder serves (its
		// delivery meets the same database and asks for redelivery if it
		// is down).
		e.busy.Add(1)
		return e, nil
	case err != nil:
		return nil, err
	}
	// The same row: its revision, and its creation (a forwarder removed and
	// added again under its name starts again at revision 1).
	if e != nil && e.f.Revision == f.Revision && e.f.CreatedAt.Equal(f.CreatedAt) && (e.until.IsZero() || s.now().Before(e.until)) {
		e.checked = s.now()
		e.busy.Add(1)
		return e, nil
	}
	ne, err := s.build(f)
	if err != nil {
		return nil, err
	}
	if e != nil {
		s.retire(e)
	}
	s.entries[name] = ne
	ne.busy.Add(1)
	return ne, nil
}

// retire closes e's engine once its deliveries in flight are done (called
// with s.mu held).
func (s *forwarderSet) retire(e *forwarderEntry) {
	s.retired.Add(1)
	go func() {
		defer s.retired.Done()
		e.busy.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := e.h.Close(ctx); err != nil {
			s.fwd.Logger.Warn("consume: closing a replaced forwarder's engine", "forwarder", e.f.Name, "error", err.Error())
		}
	}()
}

// build makes a forwarder's engine and handler from its row.
func (s *forwarderSet) build(f forwarders.Forwarder) (*forwarderEntry, error) {
	timeout := s.fwd.ForwardTimeout
	if f.TimeoutSeconds > 0 {
		timeout = time.Duration(f.TimeoutSeconds) * time.Second
	}
	// An hmac forwarder signs with its secret, and with the previous one
	// until it expires (forwarders.RotationOverlap).
	now := s.now()
	var secrets []string
	if f.Auth == forward.AuthHMAC {
		var err error
		if secrets, err = s.keys.Secrets(f, now); err != nil {
			return nil, err
		}
	}
	var until time.Time
	if len(secrets) > 1 {
		until = f.PreviousUntil
	}
	bp := &breakerPause{} // on below, once the handler exists
	breaker := s.fwd.ForwardBreaker
	pauses := s.push != nil && breaker.Threshold >= 0
	if pauses && s.base.MaxDeliveryAttempts > 0 {
		// Pub/Sub counts the failures before the pause: see
		// pushBreakerThreshold.
		breaker.Threshold = min(cmp.Or(breaker.Threshold, forward.DefaultBreakerThreshold), max(1, s.base.MaxDeliveryAttempts-2))
	}
	fh, err := forward.New(forward.Options{URL: f.URL, Auth: f.Auth, Audience: f.Audience, Timeout: timeout, Secrets: secrets,
		Breaker: breaker, Name: f.Name, Logger: s.fwd.Logger, OnTransition: bp.transition})
	if err != nil {
		return nil, err
	}
	o := s.base
	o.ConsumerID, o.Subscription, o.Handler, o.Emits = f.Name, f.Subscription(), fh, []string{}
	engine, err := consumer.New(o)
	if err != nil {
		return nil, err
	}
	h, err := New(Options{Engine: engine, DB: s.db, InboxRetention: s.retention, Logger: s.fwd.Logger, Pausable: true, PauseEvery: s.pauseEvery,
		Flow: FlowLimits{MaxInFlight: f.MaxInFlight, MaxPerSecond: f.MaxPerSecond, MaxWait: s.flowWait}})
	if err != nil {
		_ = engine.Close(context.Background())
		return nil, err
	}
	if pauses {
		bp.db, bp.push, bp.sub, bp.consumerID, bp.fwd, bp.log = s.db, s.push, f.Subscription(), f.Name, fh, s.fwd.Logger
		bp.breaker, bp.now, bp.timeout = breaker, time.Now, breakerPauseTimeout
		bp.on = true
		h.breaker = bp
		h.close = append([]func(context.Context) error{bp.close}, h.close...)
	}
	s.fwd.Logger.Info("consume: serving forwarder", "forwarder", f.Name, "topic", f.Topic, "revision", f.Revision)
	return &forwarderEntry{f: f, engine: engine, h: h, checked: now, until: until}, nil
}

// ship ships the attempts of every forwarder the registry holds.
func (s *forwarderSet) ship(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	fs, err := forwarders.List(ctx, s.db)
	if err != nil {
		s.fwd.Logger.WarnContext(ctx, "consume: cannot list the forwarders to ship their attempts", "error", err.Error())
		writeJSON(w, http.StatusInternalServerError, map[string]any{"shipped": 0, "error": "the forwarders' registry is unavailable; see the logs"})
		return
	}
	var total consumer.ShipReport
	for _, f := range fs {
		e, err := s.entry(ctx, f.Name)
		if errors.Is(err, forwarders.ErrNotFound) {
			continue
		}
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]any{"shipped": total.Shipped, "error": "shipping stopped early; see the logs"})
			return
		}
		rep, err := e.engine.Ship(ctx, 45*time.Second/time.Duration(len(fs)))
		e.busy.Done()
		total.Shipped += rep.Shipped
		total.More = total.More || rep.More
		if err != nil {
			s.fwd.Logger.WarnContext(ctx, "consume: shipping a forwarder's attempts failed; the next run tries again", "forwarder", f.Name, "error", err.Error())
			writeJSON(w, http.StatusInternalServerError, map[string]any{"shipped": total.Shipped, "error": "shipping stopped early; see the logs"})
			return
		}
	}
	writeJSON(w, http.StatusOK, total)
}

// forwarderProbe is one forwarder's part of POST /breaker:probe's answer.
type forwarderProbe struct {
	Forwarder string `json:"forwarder"`
	probeReport
	Error string `json:"error,omitempty"`
}

// probe serves POST /breaker:probe: the breaker's probe of every forwarder
// of the registry (breakerPause.probe: nothing to do for one not paused by
// its breaker).
func (s *forwarderSet) probe(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if s.push == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"code": "no_breaker_pause",
			"message": "the forwarders' breakers pause their subscriptions' push endpoints, which this broker does not have"})
		return
	}
	fs, err := forwarders.List(ctx, s.db)
	if err != nil {
		s.fwd.Logger.WarnContext(ctx, "consume: cannot list the forwarders to probe their targets", "error", err.Error())
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": "the forwarders' registry is unavailable; see the logs"})
		return
	}
	out, failed := []forwarderProbe{}, false
	for _, f := range fs {
		e, err := s.entry(ctx, f.Name)
		if errors.Is(err, forwarders.ErrNotFound) {
			continue
		}
		if err != nil {
			out, failed = append(out, forwarderProbe{Forwarder: f.Name, Error: "cannot serve the forwarder; see the logs"}), true
			continue
		}
		if e.h.breaker == nil {
			e.busy.Done()
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, breakerPauseTimeout)
		rep, err := e.h.breaker.probe(pctx)
		cancel()
		e.busy.Done()
		fp := forwarderProbe{Forwarder: f.Name, probeReport: rep}
		if err != nil {
			s.fwd.Logger.ErrorContext(ctx, "consume: a forwarder's breaker probe failed; the next run tries again", "forwarder", f.Name, "error", err.Error())
			fp.Error, failed = "the probe failed; see the logs", true
		}
		out = append(out, fp)
	}
	code := http.StatusOK
	if failed {
		code = http.StatusInternalServerError
	}
	writeJSON(w, code, map[string]any{"forwarders": out})
}

// Close closes every forwarder's engine (their queued attempts shipped)
// within ctx.
func (s *forwarderSet) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	es := s.entries
	s.entries = map[string]*forwarderEntry{}
	s.mu.Unlock()
	var errs []error
	for _, e := range es {
		e.busy.Wait()
		errs = append(errs, e.h.Close(ctx))
	}
	s.retired.Wait()
	return errors.Join(errs...)
}
