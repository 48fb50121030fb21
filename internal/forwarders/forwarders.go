// Package forwarders is the registry of forward consumers added at run
// time: a table in the forwarders service's database (relaybus_inbox_forwarders,
// the inbox line's migration 007) that the operators' API
// (functions/dlqreplay's /forwarders) writes and the consume service
// deployed with CONSUMER_HANDLER=forwarders reads, so that a webhook
// consumer is added, changed and removed without a deploy.
//
// A forwarder is a consumer like a declared one: its name is its consumer
// id (the inbox's scope, the ledger's consumerId), its subscription is
// <topic>.<name>-forwarder, ordered, with the topology's retry policy and
// dead-letter policy, and its deliveries go through the same engine (inbox,
// attempts, dead letters) to the forward handler (shared/forward).
package forwarders

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	neturl "net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/topology"
)

// Role is the role segment of every forwarder's subscription.
const Role = "forwarder"

// Bounds of a forwarder's settings.
const (
	MaxURL          = 2048
	MaxDescription  = 500
	MaxInFlightCap  = 1000
	MaxPerSecondCap = 10000
	// MaxFilter bounds a subscription's whole filter (Pub/Sub's limit),
	// the replay filter ANDed with the forwarder's own included.
	MaxFilter = 256
)

// Forwarder is one forward consumer added at run time.
type Forwarder struct {
	// Name is the consumer id (names.ConsumerRule), unique across the
	// topology's consumers and the other forwarders.
	Name string `json:"name"`
	// Topic is the topic it receives, one the topology declares.
	Topic string `json:"topic"`
	// URL is where each event is POSTed (an absolute http(s) URL; https
	// with Auth google unless it is a loopback address).
	URL string `json:"url"`
	// Auth is topology.ForwardAuthNone, ForwardAuthGoogle (a
	// Google-signed ID token for Audience, URL when empty) or
	// ForwardAuthHMAC (Standard Webhooks signatures under a secret the
	// API generates: SealedSecret).
	Auth     string `json:"auth"`
	Audience string `json:"audience,omitempty"`
	// Filter is a Pub/Sub filter on the messages' attributes (e.g.
	// attributes.event_type = "order.purchased"), ANDed with the replay
	// filter; empty takes every event. It cannot change once the
	// subscription exists (Pub/Sub's rule).
	Filter string `json:"filter,omitempty"`
	// MaxInFlight and MaxPerSecond are its flow-control limits in each
	// instance of the forwarders service (0: none).
	MaxInFlight  int     `json:"maxInFlight"`
	MaxPerSecond float64 `json:"maxPerSecond"`
	// TimeoutSeconds bounds one forward (0: shared/forward's default,
	// 10 s); below the subscription's ack deadline.
	TimeoutSeconds int    `json:"timeoutSeconds"`
	Description    string `json:"description,omitempty"`
	// SealedSecret is the signing secret with auth hmac, sealed (Keys);
	// never shown. SealedPrevious is the rotated-out one, which signs
	// beside it until PreviousUntil (RotationOverlap after the rotation).
	SealedSecret   string    `json:"-"`
	SealedPrevious string    `json:"-"`
	PreviousUntil  time.Time `json:"previousSecretUntil,omitzero"`
	// Revision grows at each change.
	Revision  int64     `json:"revision"`
	CreatedAt time.Time `json:"createdAt"`
	CreatedBy string    `json:"createdBy"`
	UpdatedAt time.Time `json:"updatedAt"`
	UpdatedBy string    `json:"updatedBy"`
}

// Subscription is the forwarder's subscription id:
// <topic>.<name>-forwarder.
func (f Forwarder) Subscription() string { return f.Topic + "." + f.Name + "-" + Role }

// Consumer is the forwarder as a topology consumer: what its subscription
// is made from (ordering, filter, retry and dead-letter settings from the
// topology's defaults).
func (f Forwarder) Consumer(t *topology.Topology) topology.Consumer {
	d := t.Defaults
	return topology.Consumer{Service: f.Name, Role: Role, Topic: f.Topic, Delivery: topology.DeliveryPush,
		Handler: topology.HandlerForward, ForwardURL: f.URL, ForwardAuth: f.Auth, ForwardAudience: f.Audience,
		ForwardTimeoutSeconds: f.TimeoutSeconds, ExtraFilter: f.Filter, Description: f.Description,
		AckDeadlineSeconds: d.AckDeadlineSeconds, MinBackoffSeconds: d.MinBackoffSeconds,
		MaxBackoffSeconds: d.MaxBackoffSeconds, MaxDeliveryAttempts: d.MaxDeliveryAttempts,
		MaxInFlight: f.MaxInFlight, MaxPerSecond: f.MaxPerSecond}
}

// Check validates f against the topology and returns every broken field
// with its rule (nil: valid). It normalizes what has a default (Auth).
func (f *Forwarder) Check(t *topology.Topology) []*event.FieldError {
	var bad []*event.FieldError
	add := func(field, rule string, a ...any) {
		bad = append(bad, &event.FieldError{Field: field, Rule: fmt.Sprintf(rule, a...)})
	}
	if names.ValidateConsumer(f.Name) != nil {
		add("name", "%s", names.ConsumerRule)
	} else if t != nil {
		for _, c := range t.Consumers() {
			if c.Service == f.Name {
				add("name", "%s is a consumer infra/topology.yaml declares (on %s): a forwarder needs a name no declared consumer has", f.Name, c.Topic)
				break
			}
		}
	}
	switch {
	case names.ValidateTopic(f.Topic) != nil || names.IsDeadLetter(f.Topic):
		add("topic", "%s", names.TopicRule)
	case t != nil && t.Topic(f.Topic) == nil:
		add("topic", "unknown topic: infra/topology.yaml declares no topic %s", f.Topic)
	}
	if f.Auth == "" {
		f.Auth = topology.ForwardAuthNone
	}
	switch f.Auth {
	case topology.ForwardAuthNone, topology.ForwardAuthGoogle, topology.ForwardAuthHMAC:
	default:
		add("auth", "must be none, google or hmac")
	}
	if u, err := neturl.Parse(f.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(f.URL) > MaxURL {
		add("url", "must be an absolute http(s) URL of at most %d characters", MaxURL)
	} else if u.User != nil {
		add("url", "must not carry a user or password: it is shown in the API, the console and the audit log (authenticate with auth)")
	} else if u.RawQuery != "" || u.Fragment != "" {
		add("url", "must not carry a query or fragment: it is shown in the API, the console and the audit log (authenticate with auth)")
	} else if carries[f.Auth] != "" && u.Scheme != "https" && !loopback(u.Hostname()) {
		add("url", "must be https with auth %s: the requests carry %s (http:// only for a loopback target)", f.Auth, carries[f.Auth])
	}
	if f.Audience != "" && f.Auth != topology.ForwardAuthGoogle {
		add("audience", "only auth google takes an audience")
	} else if len(f.Audience) > MaxURL {
		add("audience", "at most %d characters", MaxURL)
	}
	if f.Filter != "" {
		c := topology.Consumer{Service: f.Name, Topic: f.Topic, ExtraFilter: f.Filter}
		if n := len(c.Filter()); n > MaxFilter {
			add("filter", "the subscription's whole filter (this one ANDed with the replay filter) is %d bytes: Pub/Sub takes at most %d", n, MaxFilter)
		}
	}
	if f.MaxInFlight < 0 || f.MaxInFlight > MaxInFlightCap {
		add("maxInFlight", "from 0 (no bound) to %d", MaxInFlightCap)
	}
	if f.MaxPerSecond < 0 || f.MaxPerSecond > MaxPerSecondCap || math.IsNaN(f.MaxPerSecond) {
		add("maxPerSecond", "from 0 (no limit) to %d", MaxPerSecondCap)
	}
	ack := 600
	if t != nil {
		ack = t.Defaults.AckDeadlineSeconds
	}
	if f.TimeoutSeconds < 0 || f.TimeoutSeconds >= ack {
		add("timeoutSeconds", "from 0 (the default, %d s) to %d: below the subscription's ack deadline (%d s)", topology.DefaultForwardTimeoutSeconds, ack-1, ack)
	}
	if len(f.Description) > MaxDescription {
		add("description", "at most %d characters", MaxDescription)
	}
	return bad
}

// carries says what credentials each auth puts on the requests.
var carries = map[string]string{topology.ForwardAuthGoogle: "an ID token", topology.ForwardAuthHMAC: "a signature"}

func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Errors of the store.
var (
	// ErrExists: a forwarder of that name exists.
	ErrExists = errors.New("forwarders: a forwarder of that name exists")
	// ErrChanged: the forwarder changed since it was read.
	ErrChanged = errors.New("forwarders: the forwarder changed meanwhile")
	// ErrNotFound: no forwarder has that name.
	ErrNotFound = errors.New("forwarders: no forwarder of that name")
	// ErrNotMigrated: the database has no relaybus_inbox_forwarders table yet
	// (the forwarders service's migrations have not run).
	ErrNotMigrated = errors.New("forwarders: the database has no relaybus_inbox_forwarders table, or an older one: deploy the forwarders consume service (its migrations create it) or run `consume migrate`")
)

const columns = `name, topic, url, auth, audience, filter, max_in_flight, max_per_second, timeout_seconds, description,
	signing_secret, previous_signing_secret, previous_until, revision, created_at, created_by, updated_at, updated_by`

func scan(row pgx.Row) (Forwarder, error) {
	var f Forwarder
	var until *time.Time
	err := row.Scan(&f.Name, &f.Topic, &f.URL, &f.Auth, &f.Audience, &f.Filter, &f.MaxInFlight, &f.MaxPerSecond,
		&f.TimeoutSeconds, &f.Description, &f.SealedSecret, &f.SealedPrevious, &until,
		&f.Revision, &f.CreatedAt, &f.CreatedBy, &f.UpdatedAt, &f.UpdatedBy)
	if until != nil {
		f.PreviousUntil = *until
	}
	return f, err
}

// nullTime is t for a timestamptz column, NULL when t is zero.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// storeErr maps Postgres's answers to the store's errors.
func storeErr(err error) error {
	var pe *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrNoRows):
		return ErrNotFound
	case errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "42703"): // undefined_table, undefined_column
		return fmt.Errorf("%w: %w", ErrNotMigrated, err)
	case errors.As(err, &pe) && pe.Code == "23505": // unique_violation
		return ErrExists
	}
	return fmt.Errorf("forwarders: %w", err)
}

// List returns every forwarder, by name.
func List(ctx context.Context, db postgres.DBTX) ([]Forwarder, error) {
	rows, err := db.Query(ctx, `SELECT `+columns+` FROM relaybus_inbox_forwarders ORDER BY name`)
	if err != nil {
		return nil, storeErr(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Forwarder, error) { return scan(r) })
	if err != nil {
		return nil, storeErr(err)
	}
	return out, nil
}

// Get returns the forwarder named name (ErrNotFound when none is).
func Get(ctx context.Context, db postgres.DBTX, name string) (Forwarder, error) {
	f, err := scan(db.QueryRow(ctx, `SELECT `+columns+` FROM relaybus_inbox_forwarders WHERE name = $1`, name))
	return f, storeErr(err)
}

// Add inserts f, created by who (ErrExists when its name is taken), and
// returns it as stored.
func Add(ctx context.Context, db postgres.DBTX, f Forwarder, who string) (Forwarder, error) {
	out, err := scan(db.QueryRow(ctx, `INSERT INTO relaybus_inbox_forwarders
		(name, topic, url, auth, audience, filter, max_in_flight, max_per_second, timeout_seconds, description, signing_secret, created_by, updated_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12) RETURNING `+columns,
		f.Name, f.Topic, f.URL, f.Auth, f.Audience, f.Filter, f.MaxInFlight, f.MaxPerSecond, f.TimeoutSeconds, f.Description, f.SealedSecret, who))
	return out, storeErr(err)
}

// Update writes f's changeable settings (URL, auth, audience, flow
// limits, timeout, description, signing secrets) over the forwarder of
// its name at f.Revision, by who, and returns it as stored with its
// revision advanced; a write that changes nothing leaves the row (and its
// revision) alone. ErrNotFound when there is none, ErrChanged when another
// change came first (f was read at an older revision: read it again).
func Update(ctx context.Context, db postgres.DBTX, f Forwarder, who string) (Forwarder, bool, error) {
	out, err := scan(db.QueryRow(ctx, `UPDATE relaybus_inbox_forwarders SET url = $2, auth = $3, audience = $4, max_in_flight = $5,
		max_per_second = $6, timeout_seconds = $7, description = $8, signing_secret = $10, previous_signing_secret = $11,
		previous_until = $12, revision = revision + 1, updated_at = now(), updated_by = $9
		WHERE name = $1 AND revision = $13 AND (url, auth, audience, max_in_flight, max_per_second, timeout_seconds, description,
				signing_secret, previous_signing_secret, previous_until)
			IS DISTINCT FROM ($2, $3, $4, $5, $6::double precision, $7, $8, $10, $11, $12::timestamptz)
		RETURNING `+columns, f.Name, f.URL, f.Auth, f.Audience, f.MaxInFlight, f.MaxPerSecond, f.TimeoutSeconds, f.Description, who,
		f.SealedSecret, f.SealedPrevious, nullTime(f.PreviousUntil), f.Revision))
	if errors.Is(err, pgx.ErrNoRows) {
		cur, gerr := Get(ctx, db, f.Name)
		if gerr == nil && cur.Revision != f.Revision {
			return cur, false, ErrChanged
		}
		return cur, false, gerr
	}
	return out, err == nil, storeErr(err)
}

// Delete removes the forwarder named name and returns it (ErrNotFound
// when there is none).
func Delete(ctx context.Context, db postgres.DBTX, name string) (Forwarder, error) {
	f, err := scan(db.QueryRow(ctx, `DELETE FROM relaybus_inbox_forwarders WHERE name = $1 RETURNING `+columns, name))
	return f, storeErr(err)
}
