package dlqreplay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/relaybus/relaybus/internal/history"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/topology"
)

// Backfills (docs/history.md): one consumer fed a topic's history through
// its own handler and inbox. A backfill is a row in the outbox database
// that holds the topic's events (internal/history); like a replay job it
// advances while a caller drives it (POST /backfills/{id}:run works on it
// for a slice and answers its progress; `relaybus backfill` calls it until
// it ends), and any instance can continue it from its cursor.

// MaxBackfillSlice bounds one POST /backfills/{id}:run.
const MaxBackfillSlice = 240 * time.Second

// DefaultBackfillSlice is a :run's slice when the request names none.
const DefaultBackfillSlice = 25 * time.Second

// backfills serves the backfills.
type backfills struct {
	dbs      databases
	topology *topology.Topology
	g        *guard
	// forwarders, when set, admits the forwarders added at run time as
	// consumers of their topic.
	forwarders *forwarderAPI
}

// backfillRoutes are the backfills' routes, appended to routesOf's table.
func backfillRoutes(bf *backfills) routeTable {
	return routeTable{
		{"POST", "backfills", RoleViewer, bf.create},
		{"GET", "backfills", RoleViewer, bf.list},
		{"GET", "backfills/{}", RoleViewer, bf.get},
		{"POST", "backfills/{}:run", RoleOperator, bf.run},
		{"POST", "backfills/{}:pause", RoleOperator, bf.pause},
		{"POST", "backfills/{}:resume", RoleOperator, bf.resume},
		{"POST", "backfills/{}:cancel", RoleOperator, bf.cancel},
	}
}

// backfillRequest is POST /backfills's body.
type backfillRequest struct {
	Topic    string `json:"topic"`
	Consumer string `json:"consumer"`
	Since    string `json:"since"`
	// Until is the watermark (default: now): the consumer's subscription
	// must exist by then, so every later event reaches it live.
	Until      string   `json:"until"`
	Aggregates []string `json:"aggregates"`
	Rate       *float64 `json:"rate"`
	// Database is the topology's database whose outbox holds the topic's
	// events ("main" by default).
	Database string `json:"database"`
	DryRun   bool   `json:"dryRun"`
}

const ruleAggregates = "at most %d aggregate ids, each 1 to 256 characters of [A-Za-z0-9:_-]"

// spec validates the request, naming each broken field with its rule.
func (req backfillRequest) spec(top *topology.Topology, dbs databases, now time.Time) (history.Spec, string, error) {
	var bad invalid
	s := history.Spec{Topic: req.Topic, Consumer: req.Consumer, Aggregates: req.Aggregates, Rate: history.DefaultRate}
	bad.topicConsumer(top, req.Topic, req.Consumer)
	tm := func(name, v string, def time.Time) time.Time {
		if v == "" {
			if def.IsZero() {
				bad.add(name, "required: %s", ruleTime)
			}
			return def
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil || t.Before(minTime) || !t.Before(maxTime) || len(v) > 40 {
			bad.add(name, "%s", ruleTime)
			return time.Time{}
		}
		return t.UTC()
	}
	s.Since, s.Until = tm("since", req.Since, time.Time{}), tm("until", req.Until, now.UTC())
	if !s.Since.IsZero() && !s.Until.IsZero() && !s.Since.Before(s.Until) {
		bad.add("until", "later than since")
	}
	if len(req.Aggregates) > history.MaxAggregates {
		bad.add("aggregates", ruleAggregates, history.MaxAggregates)
	} else {
		for _, a := range req.Aggregates {
			if event.ValidateAggregateID(a) != nil {
				bad.add("aggregates", ruleAggregates, history.MaxAggregates)
				break
			}
		}
	}
	if req.Rate != nil {
		s.Rate = *req.Rate
		if s.Rate < 1 || s.Rate > history.MaxRate {
			bad.add("rate", "events per second, from 1 to %d (default %d)", history.MaxRate, history.DefaultRate)
		}
	}
	db := req.Database
	if db == "" {
		db = topology.MainDatabase
	}
	if _, ok := dbs.declared(top, db); !ok {
		bad.add("database", "a database of the topology this API reaches")
	}
	return s, db, bad.err()
}

// create is POST /backfills: a dry run counts the events (a viewer's
// read); otherwise the backfill is created and audited (an operator's
// action), and a caller drives it with :run.
func (bf *backfills) create(r *request, _ []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	var req backfillRequest
	if err := decodeBody(r.Request, &req, false); err != nil {
		return nil, err
	}
	top := bf.topology
	if bf.forwarders != nil {
		top = bf.forwarders.declaring(r.Context(), top, req.Topic, req.Consumer)
	}
	s, dbName, err := req.spec(top, bf.dbs, time.Now())
	if err != nil {
		return nil, err
	}
	role := RoleOperator
	if req.DryRun {
		role = RoleViewer
	}
	if err := bf.g.authorize(r, audit.Backfill, role, target{Topic: s.Topic, Consumer: s.Consumer}); err != nil {
		return nil, err
	}
	db := bf.dbs.mustOf(dbName)
	if req.DryRun {
		n, err := history.Count(r.Context(), db, s)
		if err != nil {
			return nil, err
		}
		return map[string]any{"dryRun": true, "topic": s.Topic, "consumer": s.Consumer, "since": s.Since, "until": s.Until,
			"aggregates": s.Aggregates, "rate": s.Rate, "database": dbName, "matched": n}, nil
	}
	s.By = r.who.Name
	id := history.NewID(time.Now())
	var out history.Backfill
	err = bf.g.run(r, audit.Entry{Action: audit.Backfill, Topic: s.Topic, ConsumerID: s.Consumer,
		Detail: fmt.Sprintf("backfill %s: %s to %s, %s to %s, %d aggregates, at %g/s", id, s.Topic, s.Consumer,
			s.Since.Format(time.RFC3339), s.Until.Format(time.RFC3339), len(s.Aggregates), s.Rate)},
		func(*step) (string, error) {
			var err error
			out, err = history.Start(r.Context(), db, id, s)
			return fmt.Sprintf("backfill %s created: %d events", id, out.Matched), err
		})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// find returns the backfill with id from whichever database holds it.
func (bf *backfills) find(ctx context.Context, id string) (history.Backfill, postgres.DBTX, error) {
	if !charset(id, 64, "-") {
		return history.Backfill{}, nil, badRequest([]*event.FieldError{{Field: "id", Rule: "a backfill id: 1 to 64 characters of [A-Za-z0-9-]"}})
	}
	all := bf.dbs.all()
	dbNames := make([]string, 0, len(all))
	for n := range all {
		dbNames = append(dbNames, n)
	}
	sort.Strings(dbNames)
	for _, n := range dbNames {
		b, err := history.Get(ctx, all[n], id)
		if errors.Is(err, history.ErrNotFound) {
			continue
		}
		return b, all[n], err
	}
	return history.Backfill{}, nil, fail(http.StatusNotFound, "not_found", "no backfill has that id")
}

// list is GET /backfills: the newest first (limit, 20 by default), from
// every database.
func (bf *backfills) list(r *request, _ []string) (any, error) {
	q := newQuery(r.Request, "limit")
	limit := q.integer("limit", 1, 200)
	if err := q.err(); err != nil {
		return nil, err
	}
	if limit == 0 {
		limit = 20
	}
	out := []history.Backfill{}
	for _, db := range bf.dbs.all() {
		bs, err := history.List(r.Context(), db, limit)
		if err != nil {
			return nil, err
		}
		out = append(out, bs...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.After(out[j].CreatedAt) })
	if len(out) > limit {
		out = out[:limit]
	}
	return map[string]any{"backfills": out}, nil
}

// get is GET /backfills/{id}: the backfill and its progress.
func (bf *backfills) get(r *request, args []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	b, _, err := bf.find(r.Context(), args[0])
	return b, err
}

// backfillRunRequest is POST /backfills/{id}:run's optional body.
type backfillRunRequest struct {
	Seconds int `json:"seconds"`
}

// run is POST /backfills/{id}:run: queue the backfill's events at its
// rate for a slice, inside this request, and answer its progress.
func (bf *backfills) run(r *request, args []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	var req backfillRunRequest
	if err := decodeBody(r.Request, &req, true); err != nil {
		return nil, err
	}
	if req.Seconds < 0 || time.Duration(req.Seconds)*time.Second > MaxBackfillSlice {
		return nil, badRequest([]*event.FieldError{{Field: "seconds", Rule: fmt.Sprintf("an integer from 1 to %d (default %d)",
			int(MaxBackfillSlice.Seconds()), int(DefaultBackfillSlice.Seconds()))}})
	}
	slice := DefaultBackfillSlice
	if req.Seconds > 0 {
		slice = time.Duration(req.Seconds) * time.Second
	}
	b, db, err := bf.find(r.Context(), args[0])
	if err != nil {
		return nil, err
	}
	if err := bf.g.authorize(r, audit.Backfill, RoleOperator, target{Topic: b.Topic, Consumer: b.Consumer}); err != nil {
		return nil, err
	}
	return history.Run(r.Context(), db, b.ID, time.Now().Add(slice))
}

func (bf *backfills) pause(r *request, args []string) (any, error) {
	return bf.set(r, args[0], history.ActionPause)
}

func (bf *backfills) resume(r *request, args []string) (any, error) {
	return bf.set(r, args[0], history.ActionResume)
}

func (bf *backfills) cancel(r *request, args []string) (any, error) {
	return bf.set(r, args[0], history.ActionCancel)
}

// set applies an action, audited; one the backfill's state refuses is a 409.
func (bf *backfills) set(r *request, id, action string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	if err := decodeBody(r.Request, &struct{}{}, true); err != nil {
		return nil, err
	}
	b, db, err := bf.find(r.Context(), id)
	if err != nil {
		return nil, err
	}
	if err := bf.g.authorize(r, audit.BackfillControl, RoleOperator, target{Topic: b.Topic, Consumer: b.Consumer}); err != nil {
		return nil, err
	}
	var out history.Backfill
	err = bf.g.run(r, audit.Entry{Action: audit.BackfillControl, Topic: b.Topic, ConsumerID: b.Consumer, Detail: action + " backfill " + id},
		func(*step) (string, error) {
			var err error
			out, err = history.Set(r.Context(), db, id, action)
			var se *history.StateError
			if errors.As(err, &se) {
				return "", fail(http.StatusConflict, "wrong_state", "backfill %s is %s: it cannot be %s", id, se.State, se.Action)
			}
			return "backfill " + id + " " + out.State, err
		})
	if err != nil {
		return nil, err
	}
	return out, nil
}
