package dlqreplay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/topology"
)

// A strict consumer's gaps are listed and released here, in the consumer's
// own database, rather than by calling its consume service: consume services
// take internal ingress only, and a request from another Cloud Run service
// is internal only when routed through a VPC network ("Requests to Cloud Run
// from Cloud Run ... must go to the VPC network to be considered internal",
// https://cloud.google.com/run/docs/securing/ingress). dlqreplay holds every
// database's URL and the resequencer's tables are the truth of the gaps, so
// the operators' API reads and writes them directly, with its own auth,
// read-only mode and audit log. A skip records the skipped versions and
// moves the position in one transaction under the aggregate's lock, as the
// consume service's own /gaps:skip does; the parked versions it makes next
// are applied by the consumer's handler at its next POST /gaps:check (its
// Scheduler job, every minute).

// beginner starts a transaction (a *pgxpool.Pool).
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// txRunner runs a resequencer's work in one transaction of a consumer's
// database (projection.Runner). Nothing is shipped to the ledger: listing
// and skipping record no attempt.
type txRunner struct {
	db         beginner
	consumerID string
}

func (r txRunner) Do(ctx context.Context, f func(ctx context.Context, c *consumer.Context) error) error {
	return pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error {
		return f(ctx, &consumer.Context{Tx: tx, ConsumerID: r.consumerID})
	})
}

// strictConsumer finds the strict consumer of a path and its database.
func (dl *deliveryControl) strictConsumer(r *request, args []string) (topology.Consumer, txRunner, error) {
	topic, id, err := consumerPath(args)
	if err != nil {
		return topology.Consumer{}, txRunner{}, err
	}
	c, err := dl.declared(topic, id)
	if err != nil {
		return c, txRunner{}, err
	}
	if c.Handler != topology.HandlerStrict {
		return c, txRunner{}, fail(http.StatusNotFound, "no_gaps", "%s on %s has handler %q, which keeps no gaps (handler strict does)", id, topic, c.Handler)
	}
	db, err := dl.database(c)
	if err != nil {
		return c, txRunner{}, err
	}
	b, ok := db.(beginner)
	if !ok {
		return c, txRunner{}, fmt.Errorf("dlqreplay: the %s database's pool cannot begin transactions", c.Database)
	}
	return c, txRunner{db: b, consumerID: c.Service}, nil
}

// declared returns the topology's consumer id on topic.
func (dl *deliveryControl) declared(topic, id string) (topology.Consumer, error) {
	if dl.topology != nil {
		for _, c := range dl.topology.Consumers() {
			if c.Topic == topic && c.Service == id {
				return c, nil
			}
		}
	}
	return topology.Consumer{}, fail(http.StatusNotFound, "not_found", "the topology declares no consumer %s on %s", id, topic)
}

// database returns the consumer's database, or says that its URL is missing.
func (dl *deliveryControl) database(c topology.Consumer) (postgres.DBTX, error) {
	if db, ok := dl.dbs.of(c.Database); ok {
		return db, nil
	}
	d, _ := dl.topology.Database(c.Database)
	return nil, fail(http.StatusServiceUnavailable, "no_database", "%s's database %q is not configured here: set %s", c.Service, c.Database, d.EnvVar())
}

func (dl *deliveryControl) resequencer(c topology.Consumer) *projection.Resequencer {
	return projection.NewStrict(nil, projection.StrictOptions{GapTimeout: time.Duration(c.GapTimeoutSeconds) * time.Second, Logger: dl.logger})
}

// listGaps: GET /consumers/{topic}/{consumer}/gaps?aggregateType=&aggregateId=&limit=
func (dl *deliveryControl) listGaps(r *request, args []string) (any, error) {
	q := newQuery(r.Request, "aggregateType", "aggregateId", "limit")
	f := projection.GapFilter{
		AggregateType: q.str("aggregateType", validAggregate, ruleAggregateID),
		AggregateID:   q.str("aggregateId", validAggregate, ruleAggregateID),
		Limit:         q.integer("limit", 1, projection.DefaultGapLimit),
	}
	if err := q.err(); err != nil {
		return nil, err
	}
	c, run, err := dl.strictConsumer(r, args)
	if err != nil {
		return nil, err
	}
	rs := dl.resequencer(c)
	gaps, err := rs.Gaps(r.Context(), run, f)
	if isUndefinedTable(err) {
		gaps, err = nil, nil // the consumer has not started yet: nothing parked
	}
	if err != nil {
		return nil, err
	}
	if gaps == nil {
		gaps = []projection.Gap{}
	}
	return map[string]any{"topic": c.Topic, "consumer": c.Service, "subscription": c.Subscription(), "database": c.Database,
		"gaps": gaps, "gapTimeout": rs.GapTimeout().String()}, nil
}

// skipGap: POST /consumers/{topic}/{consumer}/gaps:skip
// {"aggregateType", "aggregateId", "version", "through", "reason"}.
func (dl *deliveryControl) skipGap(r *request, args []string) (any, error) {
	var b struct {
		AggregateType string `json:"aggregateType"`
		AggregateID   string `json:"aggregateId"`
		Version       int64  `json:"version"`
		Through       int64  `json:"through"`
		Reason        string `json:"reason"`
	}
	if err := decodeBody(r.Request, &b, false); err != nil {
		return nil, err
	}
	var bad invalid
	if b.AggregateType != "" && !validAggregate(b.AggregateType) {
		bad.add("aggregateType", "%s", ruleAggregateID)
	}
	if !validAggregate(b.AggregateID) {
		bad.add("aggregateId", "%s (required)", ruleAggregateID)
	}
	if b.Version < 1 {
		bad.add("version", "the first missing version: an integer of at least 1")
	}
	if b.Through != 0 && b.Through < b.Version {
		bad.add("through", "the last version to skip: at least version, or 0 for version alone")
	}
	if len(b.Reason) > 500 {
		bad.add("reason", "at most 500 characters")
	}
	if err := bad.err(); err != nil {
		return nil, err
	}
	topic, id, err := consumerPath(args)
	if err != nil {
		return nil, err
	}
	if err := dl.g.authorize(r, audit.GapsSkip, RoleOperator, target{Topic: topic, Consumer: id}); err != nil {
		return nil, err
	}
	c, run, err := dl.strictConsumer(r, args)
	if err != nil {
		return nil, err
	}
	var res projection.SkipResult
	err = dl.g.run(r, audit.Entry{Action: audit.GapsSkip, Topic: c.Topic, ConsumerID: c.Service,
		Detail: fmt.Sprintf("skip %s/%s versions %d through %d: %s", b.AggregateType, b.AggregateID, b.Version, max(b.Through, b.Version), b.Reason)}, func(*step) (string, error) {
		var err error
		res, err = dl.resequencer(c).Skip(r.Context(), run, projection.SkipRequest{AggregateType: b.AggregateType, AggregateID: b.AggregateID,
			Version: b.Version, Through: b.Through, Reason: b.Reason, By: r.who.Name})
		var ge *projection.GapError
		switch {
		case errors.As(err, &ge):
			return "", fail(http.StatusConflict, ge.Code, "%s", ge.Message)
		case isUndefinedTable(err):
			return "", fail(http.StatusConflict, "no_gap", "%s has parked nothing yet (its tables do not exist: the consumer has not started)", c.Service)
		case err != nil:
			return "", err
		}
		return fmt.Sprintf("%s/%s versions %v skipped: %s", res.AggregateType, res.AggregateID, res.Skipped, b.Reason), nil
	})
	if err != nil {
		return nil, err
	}
	out := map[string]any{"aggregateType": res.AggregateType, "aggregateId": res.AggregateID, "skipped": res.Skipped}
	if res.Gap != nil {
		out["gap"] = res.Gap
	}
	out["next"] = "the parked versions now next are applied by " + c.Service + "'s handler at its next POST /gaps:check (Scheduler, every minute)"
	return out, nil
}

func isUndefinedTable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42P01"
}
