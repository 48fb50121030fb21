package dlqreplay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/forwarders"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/broker"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/forward"
	"github.com/relaybus/relaybus/shared/postgres"
	"github.com/relaybus/relaybus/shared/topology"
)

// ForwardersOptions configure the forward consumers added at run time
// (GET, POST /forwarders; GET, PATCH, DELETE /forwarders/{name}): their
// registry, and the subscription each gets on the broker.
type ForwardersOptions struct {
	// URL is the forwarders consume service's URL
	// (DLQREPLAY_FORWARDERS_URL): each forwarder's subscription pushes to
	// URL/<name>. Empty: adding a forwarder answers 501.
	URL string
	// PushAccount is the service account whose OIDC token each push
	// carries (DLQREPLAY_FORWARDERS_PUSH_ACCOUNT; empty: none, as the
	// local stack runs); Audience the token's audience (URL when empty).
	PushAccount, Audience string
	// Database names the topology database that holds the registry: the
	// forwarders service's (DLQREPLAY_FORWARDERS_DATABASE, default main).
	Database string
	// NoDeadLetterPolicy leaves the subscriptions without Pub/Sub's
	// dead-letter policy (the local stack on pstest, whose dead-lettering
	// is broken; its delivery loop dead-letters itself). By default
	// a message refused the topology's max_delivery_attempts times goes
	// to <topic>.dlq, as for a declared consumer.
	NoDeadLetterPolicy bool
	// Subscriptions, when set, creates and deletes the forwarders'
	// subscriptions instead of the Broker (the local stack's also points
	// its delivery loop at each).
	Subscriptions broker.SubscriptionAdmin
	// Pull gives each forwarder a pull subscription, which the forwarders
	// service pulls itself (CONSUMER_MODE=pull), instead of one pushing to
	// URL: on NATS JetStream, which has no push (Build sets it with
	// TRANSPORT=nats; forwarders_pull.go). URL is still required, as the
	// sign that the forwarders service is deployed: without it nothing
	// would pull the forwarder while the ledger waited for it.
	Pull bool
	// Keys seal the signing secrets the API generates for hmac forwarders
	// (RELAYBUS_FORWARDERS_KEY; the forwarders service opens them with the
	// same). Nil: adding or rotating one answers 501.
	Keys *forwarders.Keys
	// Now is the clock of secret rotations (time.Now when nil).
	Now func() time.Time
}

// forwarderAPI serves the forwarders' registry.
type forwarderAPI struct {
	o        ForwardersOptions
	dbs      databases
	topology *topology.Topology
	subs     broker.SubscriptionAdmin // nil: the broker has none
	registry *consumers.Registry
	auditLog AuditLog
	g        *guard
	logger   *slog.Logger
}

// forwarderRoutes are the forwarders' routes, appended to routesOf's
// table.
func forwarderRoutes(fa *forwarderAPI) routeTable {
	return routeTable{
		{"GET", "forwarders", RoleViewer, fa.list},
		{"POST", "forwarders", RoleAdmin, fa.add},
		{"GET", "forwarders/{}", RoleViewer, fa.get},
		{"PATCH", "forwarders/{}", RoleOperator, fa.change},
		{"DELETE", "forwarders/{}", RoleAdmin, fa.remove},
	}
}

func (fa *forwarderAPI) db() (postgres.DBTX, error) {
	name := fa.databaseName()
	db, ok := fa.dbs.of(name)
	if !ok {
		return nil, fail(http.StatusNotImplemented, "not_configured", "the forwarders' registry is in database %s, which this API does not reach (DLQREPLAY_FORWARDERS_DATABASE, DLQREPLAY_DATABASE_URLS)", name)
	}
	return db, nil
}

// forwarderView is a forwarder with where it is delivered from and to.
type forwarderView struct {
	forwarders.Forwarder
	Subscription string `json:"subscription"`
	PushEndpoint string `json:"pushEndpoint,omitempty"`
}

func (fa *forwarderAPI) view(f forwarders.Forwarder) forwarderView {
	v := forwarderView{Forwarder: f, Subscription: f.Subscription()}
	if !f.PreviousUntil.After(fa.now()) {
		v.PreviousUntil = time.Time{} // the previous secret no longer signs
	}
	if fa.o.URL != "" && !fa.o.Pull {
		v.PushEndpoint = fa.endpoint(f.Name)
	}
	return v
}

func (fa *forwarderAPI) endpoint(name string) string {
	return strings.TrimSuffix(fa.o.URL, "/") + "/" + name
}

// pushEndpoint is how a forwarder's subscription pushes: to the forwarders
// service under its name, with the push account's OIDC token (its
// audience the service's URL unless ForwardersOptions says otherwise).
func (fa *forwarderAPI) pushEndpoint(name string) broker.PushEndpoint {
	e := broker.PushEndpoint{URL: fa.endpoint(name), ServiceAccount: fa.o.PushAccount, Audience: fa.o.Audience}
	if e.ServiceAccount != "" && e.Audience == "" {
		e.Audience = fa.o.URL
	}
	return e
}

// databaseName is the topology database that holds the registry (and
// the forwarders' inbox, where their pauses are recorded).
func (fa *forwarderAPI) databaseName() string {
	if fa.o.Database == "" {
		return topology.MainDatabase
	}
	return fa.o.Database
}

// consumer returns the forwarder named id on topic as a topology consumer
// (its database the registry's); ok is false when the registry holds
// none there, or cannot be read.
func (fa *forwarderAPI) consumer(ctx context.Context, topic, id string) (topology.Consumer, bool) {
	if fa == nil || fa.topology == nil || names.ValidateConsumer(id) != nil {
		return topology.Consumer{}, false
	}
	db, err := fa.db()
	if err != nil {
		return topology.Consumer{}, false
	}
	f, err := forwarders.Get(ctx, db, id)
	if err != nil || f.Topic != topic {
		return topology.Consumer{}, false
	}
	c := f.Consumer(fa.topology)
	c.Database = fa.databaseName()
	return c, true
}

// storeErr answers the registry's refusals.
func storeErr(err error, name string) error {
	switch {
	case errors.Is(err, forwarders.ErrNotFound):
		return fail(http.StatusNotFound, "not_found", "no forwarder is named %s", name)
	case errors.Is(err, forwarders.ErrChanged):
		return fail(http.StatusConflict, "changed", "forwarder %s was changed by another request meanwhile: read it again (GET /forwarders/%s) and repeat the change", name, name)
	case errors.Is(err, forwarders.ErrExists):
		return fail(http.StatusConflict, "exists", "a forwarder named %s exists: change it (PATCH /forwarders/%s) or remove it first", name, name)
	case errors.Is(err, forwarders.ErrNotMigrated):
		return fail(http.StatusConflict, "not_migrated", "%s", forwarders.ErrNotMigrated.Error())
	}
	return err
}

func (fa *forwarderAPI) list(r *request, _ []string) (any, error) {
	q := newQuery(r.Request, "topic")
	topic := q.topic("topic")
	if err := q.err(); err != nil {
		return nil, err
	}
	db, err := fa.db()
	if err != nil {
		return nil, err
	}
	fs, err := forwarders.List(r.Context(), db)
	if err != nil {
		return nil, storeErr(err, "")
	}
	out := []forwarderView{}
	for _, f := range fs {
		if topic == "" || f.Topic == topic {
			out = append(out, fa.view(f))
		}
	}
	return map[string]any{"forwarders": out}, nil
}

// forwarderPath validates a path's forwarder name.
func forwarderPath(r *request, args []string) (string, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return "", err
	}
	if names.ValidateConsumer(args[0]) != nil {
		var bad invalid
		bad.add("name", "%s", names.ConsumerRule)
		return "", bad.err()
	}
	return args[0], nil
}

// current returns the forwarders' database and the forwarder named, or
// the API's error (not configured, not found).
func (fa *forwarderAPI) current(r *request, name string) (postgres.DBTX, forwarders.Forwarder, error) {
	db, err := fa.db()
	if err != nil {
		return nil, forwarders.Forwarder{}, err
	}
	f, err := forwarders.Get(r.Context(), db, name)
	if err != nil {
		return nil, forwarders.Forwarder{}, storeErr(err, name)
	}
	return db, f, nil
}

func (fa *forwarderAPI) get(r *request, args []string) (any, error) {
	name, err := forwarderPath(r, args)
	if err != nil {
		return nil, err
	}
	_, f, err := fa.current(r, name)
	if err != nil {
		return nil, err
	}
	return map[string]any{"forwarder": fa.view(f)}, nil
}

// forwarderBody is POST /forwarders's body.
type forwarderBody struct {
	Name           string  `json:"name"`
	Topic          string  `json:"topic"`
	URL            string  `json:"url"`
	Auth           string  `json:"auth"`
	Audience       string  `json:"audience"`
	Filter         string  `json:"filter"`
	MaxInFlight    int     `json:"maxInFlight"`
	MaxPerSecond   float64 `json:"maxPerSecond"`
	TimeoutSeconds int     `json:"timeoutSeconds"`
	Description    string  `json:"description"`
}

// secretAnswer is the signing secret an add or change answers, the one
// time it is shown.
type secretAnswer struct {
	// Secret is "whsec_" + base64 of 32 random bytes: the target verifies
	// each request's webhook-signature with it (shared/forward.Verify).
	Secret string `json:"secret"`
	// PreviousUntil, after a rotation, is when the previous secret stops
	// signing beside it.
	PreviousUntil time.Time `json:"previousUntil,omitzero"`
	Note          string    `json:"note"`
}

// newSecret generates f's signing secret, sealed into f; with rotate the
// current one becomes the previous, signing too for
// forwarders.RotationOverlap. It answers 501 without keys.
func (fa *forwarderAPI) newSecret(f *forwarders.Forwarder, rotate bool) (*secretAnswer, error) {
	if fa.o.Keys == nil {
		return nil, fail(http.StatusNotImplemented, "not_configured", "hmac forwarders need %s (the key their signing secrets are sealed under) in this API's environment and the forwarders service's", forwarders.KeyEnv)
	}
	secret := forward.NewSecret()
	sealed, err := fa.o.Keys.Seal(f.Name, secret)
	if err != nil {
		return nil, err
	}
	a := &secretAnswer{Secret: secret, Note: "shown this once: keep it where the target verifies signatures (it is stored sealed; no listing shows it)"}
	if rotate && f.SealedSecret != "" {
		f.SealedPrevious, f.PreviousUntil = f.SealedSecret, fa.now().Add(forwarders.RotationOverlap).UTC().Truncate(time.Second)
		a.PreviousUntil = f.PreviousUntil
		a.Note += "; the previous secret signs beside it until " + f.PreviousUntil.Format(time.RFC3339)
	} else {
		f.SealedPrevious, f.PreviousUntil = "", time.Time{}
	}
	f.SealedSecret = sealed
	return a, nil
}

func (fa *forwarderAPI) now() time.Time {
	if fa.o.Now != nil {
		return fa.o.Now()
	}
	return time.Now()
}

// add registers a forwarder, expects it in topic_consumers (so the
// ledger waits for it as for a declared consumer), then creates its
// subscription: from then on the topic's events reach it. A step that
// fails undoes the ones before.
func (fa *forwarderAPI) add(r *request, _ []string) (any, error) {
	if err := newQuery(r.Request).err(); err != nil {
		return nil, err
	}
	var b forwarderBody
	if err := decodeBody(r.Request, &b, false); err != nil {
		return nil, err
	}
	f := forwarders.Forwarder{Name: b.Name, Topic: b.Topic, URL: b.URL, Auth: b.Auth, Audience: b.Audience, Filter: b.Filter,
		MaxInFlight: b.MaxInFlight, MaxPerSecond: b.MaxPerSecond, TimeoutSeconds: b.TimeoutSeconds, Description: b.Description}
	if bad := f.Check(fa.topology); len(bad) > 0 {
		return nil, badRequest(bad)
	}
	if err := fa.g.authorize(r, audit.ForwarderAdd, RoleAdmin, target{Topic: f.Topic}); err != nil {
		return nil, err
	}
	if fa.o.URL == "" || fa.subs == nil {
		return nil, fail(http.StatusNotImplemented, "not_configured", "forwarders cannot be added here: %s", fa.missing())
	}
	if fa.topology == nil {
		return nil, fail(http.StatusNotImplemented, "not_configured", "forwarders need the topology (RELAYBUS_TOPOLOGY): its topics and the subscriptions' settings")
	}
	var secret *secretAnswer
	if f.Auth == topology.ForwardAuthHMAC {
		s, err := fa.newSecret(&f, false)
		if err != nil {
			return nil, err
		}
		secret = s
	}
	db, err := fa.db()
	if err != nil {
		return nil, err
	}
	var out forwarderView
	err = fa.g.run(r, audit.Entry{Action: audit.ForwarderAdd, Topic: f.Topic, ConsumerID: f.Name, Subscription: f.Subscription(),
		Detail: describeForwarder(f) + secretNote(secret)}, func(st *step) (string, error) {
		ctx := context.WithoutCancel(r.Context())
		stored, err := forwarders.Add(ctx, db, f, r.who.Name)
		if err != nil {
			return "", storeErr(err, f.Name)
		}
		if err := fa.expect(r, st, f, true); err != nil {
			_, _ = forwarders.Delete(ctx, db, f.Name)
			return "", err
		}
		if err := fa.subs.CreateSubscription(ctx, fa.spec(f)); err != nil {
			_, _ = forwarders.Delete(ctx, db, f.Name)
			_ = fa.expect(r, st, f, false)
			return "", fa.brokerErr(err, f)
		}
		out = fa.view(stored)
		if fa.o.Pull {
			return "added; the forwarders service pulls " + f.Subscription(), nil
		}
		return "added; " + f.Subscription() + " pushes to " + out.PushEndpoint, nil
	})
	if err != nil {
		return nil, err
	}
	ans := map[string]any{"forwarder": out, "changed": true}
	if secret != nil {
		ans["signingSecret"] = secret
	}
	return ans, nil
}

// secretNote says in the audit log that a secret was made (never the
// secret).
func secretNote(a *secretAnswer) string {
	switch {
	case a == nil:
		return ""
	case !a.PreviousUntil.IsZero():
		return "; signing secret rotated (the previous one signs too until " + a.PreviousUntil.Format(time.RFC3339) + ")"
	}
	return "; signing secret generated"
}

// missing says what the API lacks to add forwarders.
func (fa *forwarderAPI) missing() string {
	var m []string
	if fa.o.URL == "" {
		m = append(m, "DLQREPLAY_FORWARDERS_URL (the forwarders consume service's URL) is not set: deploy the service (infra/terraform: forwarders = { enabled = true })")
	}
	if fa.subs == nil {
		m = append(m, "the broker cannot create subscriptions at run time (Pub/Sub and NATS JetStream can)")
	}
	return strings.Join(m, "; ")
}

// spec is f's subscription: ordered, pushed to the forwarders service
// under its name, the topology's retry and dead-letter settings, the
// topic's retention for seeks.
func (fa *forwarderAPI) spec(f forwarders.Forwarder) broker.SubscriptionSpec {
	if fa.o.Pull {
		return fa.pullSpec(f)
	}
	c := f.Consumer(fa.topology)
	s := broker.SubscriptionSpec{Name: f.Subscription(), Topic: f.Topic, Filter: c.Filter(), Ordered: true,
		AckDeadline: time.Duration(c.AckDeadlineSeconds) * time.Second,
		MinBackoff:  time.Duration(c.MinBackoffSeconds) * time.Second, MaxBackoff: time.Duration(c.MaxBackoffSeconds) * time.Second,
		Push: fa.pushEndpoint(f.Name)}
	s.MaxDeliveryAttempts = c.MaxDeliveryAttempts
	if !fa.o.NoDeadLetterPolicy {
		s.DeadLetterTopic = c.DeadLetterTopic()
	}
	if tp := fa.topology.Topic(f.Topic); tp != nil && tp.MessageRetentionSeconds > 0 {
		s.Retention = time.Duration(tp.MessageRetentionSeconds) * time.Second
	}
	return s
}

// brokerErr answers the broker's refusal of f's subscription.
func (fa *forwarderAPI) brokerErr(err error, f forwarders.Forwarder) error {
	switch {
	case errors.Is(err, broker.ErrExists):
		return fail(http.StatusConflict, "exists", "subscription %s exists on the broker: remove it, or choose another name", f.Subscription())
	case errors.Is(err, broker.ErrRefused) && f.Filter != "":
		return badRequest([]*event.FieldError{{Field: "filter", Rule: "the broker refused the subscription: " + err.Error()}})
	case errors.Is(err, broker.ErrRefused):
		return fail(http.StatusBadRequest, "refused", "the broker refused subscription %s: %s", f.Subscription(), err.Error())
	case errors.Is(err, broker.ErrPermissionDenied):
		return fail(http.StatusForbidden, "broker_forbidden", "this service's account may not create subscription %s: %s (infra/terraform grants it on the topology's topics)", f.Subscription(), err.Error())
	}
	return err
}

// expect enables (or, on false, disables) f in topic_consumers: the
// ledger then waits for it on the topic's new events as for a declared
// consumer, and stops waiting once it is removed.
func (fa *forwarderAPI) expect(r *request, st *step, f forwarders.Forwarder, on bool) error {
	if fa.registry == nil {
		return nil
	}
	ctx := context.WithoutCancel(r.Context())
	au := audit.Entry{Method: r.who.Method, RequestID: r.id, Ref: st.entry.ID}
	desc := "forwarder added at run time: " + f.URL
	if f.Description != "" {
		desc = f.Description
	}
	ch := consumers.ConsumerChange{Topic: f.Topic, ConsumerID: f.Name, Enabled: &on, Audit: au}
	if on {
		ch.Add, ch.Description = true, &desc
	}
	_, logged, err := fa.registry.ChangeConsumer(ctx, ch, r.who.Name)
	if on && errors.Is(err, consumers.ErrConsumerExists) {
		ch.Add = false
		_, logged, err = fa.registry.ChangeConsumer(ctx, ch, r.who.Name)
	}
	if !on && errors.Is(err, consumers.ErrConsumerNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if logged != nil && logged.ID == "" {
		if _, werr := fa.auditLog.Append(ctx, *logged); werr != nil {
			fa.logger.ErrorContext(ctx, "dlqreplay: audit outcome of a registry change not written", "consumer", f.Name, "error", werr.Error())
		}
	}
	return nil
}

// forwarderChange is PATCH /forwarders/{name}'s body: what it sets.
type forwarderChange struct {
	URL            *string  `json:"url"`
	Auth           *string  `json:"auth"`
	Audience       *string  `json:"audience"`
	MaxInFlight    *int     `json:"maxInFlight"`
	MaxPerSecond   *float64 `json:"maxPerSecond"`
	TimeoutSeconds *int     `json:"timeoutSeconds"`
	Description    *string  `json:"description"`
	// Topic and Filter cannot change (a subscription's topic and filter
	// are fixed when it is created): given, they must equal the current.
	Topic  *string `json:"topic"`
	Filter *string `json:"filter"`
	// RotateSecret, with auth hmac, generates a new signing secret
	// (answered once); the previous one signs beside it for
	// forwarders.RotationOverlap.
	RotateSecret bool `json:"rotateSecret"`
}

// change sets a forwarder's URL, auth, flow limits, timeout or
// description; the forwarders service builds its engine anew within
// its refresh (consume.DefaultForwardersRefresh).
func (fa *forwarderAPI) change(r *request, args []string) (any, error) {
	name, err := forwarderPath(r, args)
	if err != nil {
		return nil, err
	}
	var b forwarderChange
	if err := decodeBody(r.Request, &b, false); err != nil {
		return nil, err
	}
	db, cur, err := fa.current(r, name)
	if err != nil {
		return nil, err
	}
	f := cur
	set := func(p *string, to *string) {
		if p != nil {
			*to = *p
		}
	}
	set(b.URL, &f.URL)
	set(b.Auth, &f.Auth)
	set(b.Audience, &f.Audience)
	set(b.Description, &f.Description)
	if b.MaxInFlight != nil {
		f.MaxInFlight = *b.MaxInFlight
	}
	if b.MaxPerSecond != nil {
		f.MaxPerSecond = *b.MaxPerSecond
	}
	if b.TimeoutSeconds != nil {
		f.TimeoutSeconds = *b.TimeoutSeconds
	}
	var bad invalid
	if b.Topic != nil && *b.Topic != cur.Topic {
		bad.add("topic", "cannot change (a subscription's topic is fixed): remove the forwarder and add it on %s", *b.Topic)
	}
	if b.Filter != nil && *b.Filter != cur.Filter {
		bad.add("filter", "cannot change (Pub/Sub fixes a subscription's filter when it is created): remove the forwarder and add it again")
	}
	if b.RotateSecret && f.Auth != topology.ForwardAuthHMAC {
		bad.add("rotateSecret", "only a forwarder with auth hmac has a signing secret to rotate")
	}
	// Its own name is no clash: check it as a new one would be, then keep
	// only the rules a change can break.
	for _, fe := range f.Check(fa.topology) {
		if fe.Field != "name" && fe.Field != "topic" && fe.Field != "filter" {
			bad.fields = append(bad.fields, fe)
		}
	}
	if err := bad.err(); err != nil {
		return nil, err
	}
	if err := fa.g.authorize(r, audit.ForwarderChange, RoleOperator, target{Topic: cur.Topic, Consumer: name}); err != nil {
		return nil, err
	}
	// A secret is made when hmac starts or on rotation, dropped when it
	// ends.
	var secret *secretAnswer
	switch {
	case f.Auth == topology.ForwardAuthHMAC && (cur.Auth != topology.ForwardAuthHMAC || cur.SealedSecret == ""):
		secret, err = fa.newSecret(&f, false)
	case f.Auth == topology.ForwardAuthHMAC && b.RotateSecret:
		secret, err = fa.newSecret(&f, true)
	case f.Auth != topology.ForwardAuthHMAC:
		f.SealedSecret, f.SealedPrevious, f.PreviousUntil = "", "", time.Time{}
	}
	if err != nil {
		return nil, err
	}
	var out forwarders.Forwarder
	changed := false
	err = fa.g.run(r, audit.Entry{Action: audit.ForwarderChange, Topic: cur.Topic, ConsumerID: name, Subscription: cur.Subscription(),
		Detail: describeForwarder(f) + secretNote(secret)}, func(*step) (string, error) {
		var err error
		out, changed, err = forwarders.Update(context.WithoutCancel(r.Context()), db, f, r.who.Name)
		if err != nil {
			return "", storeErr(err, name)
		}
		if !changed {
			return "nothing changed", nil
		}
		return fmt.Sprintf("changed to revision %d: %s", out.Revision, describeForwarder(out)+secretNote(secret)), nil
	})
	if err != nil {
		return nil, err
	}
	ans := map[string]any{"forwarder": fa.view(out), "changed": changed}
	if secret != nil && changed {
		ans["signingSecret"] = secret
	}
	return ans, nil
}

// remove deletes a forwarder's subscription (delivery stops, its backlog
// is dropped), no longer expects it in topic_consumers, and deletes its
// registry row and its pause state; its inbox rows and attempts stay until
// the inbox purge.
func (fa *forwarderAPI) remove(r *request, args []string) (any, error) {
	name, err := forwarderPath(r, args)
	if err != nil {
		return nil, err
	}
	if err := decodeBody(r.Request, &struct{}{}, true); err != nil {
		return nil, err
	}
	db, cur, err := fa.current(r, name)
	if err != nil {
		return nil, err
	}
	if err := fa.g.authorize(r, audit.ForwarderRemove, RoleAdmin, target{Topic: cur.Topic}); err != nil {
		return nil, err
	}
	if fa.subs == nil {
		return nil, fail(http.StatusNotImplemented, "not_configured", "forwarders cannot be removed here: %s", fa.missing())
	}
	err = fa.g.run(r, audit.Entry{Action: audit.ForwarderRemove, Topic: cur.Topic, ConsumerID: name, Subscription: cur.Subscription(),
		Detail: describeForwarder(cur)}, func(st *step) (string, error) {
		ctx := context.WithoutCancel(r.Context())
		if err := fa.subs.DeleteSubscription(ctx, cur.Subscription()); err != nil && !errors.Is(err, broker.ErrNotFound) {
			return "", fa.brokerErr(err, cur)
		}
		if err := fa.expect(r, st, cur, false); err != nil {
			return "", err
		}
		if _, err := forwarders.Delete(ctx, db, name); err != nil && !errors.Is(err, forwarders.ErrNotFound) {
			return "", storeErr(err, name)
		}
		// A pause of it (an operator's or its breaker's) goes with it: one
		// added again under its name must not start paused.
		if err := inbox.ForgetPauses(ctx, db, name, cur.Topic, cur.Subscription()); err != nil {
			return "", err
		}
		return "removed; subscription " + cur.Subscription() + " deleted", nil
	})
	if err != nil {
		return nil, err
	}
	return map[string]any{"forwarder": fa.view(cur), "removed": true}, nil
}

// describeForwarder says a forwarder's settings in words, for the audit
// log (no credential: the URL has none, Check refuses one).
func describeForwarder(f forwarders.Forwarder) string {
	s := fmt.Sprintf("url: %s; auth: %s", f.URL, f.Auth)
	if f.Audience != "" {
		s += "; audience: " + f.Audience
	}
	if f.Filter != "" {
		s += "; filter: " + f.Filter
	}
	if f.MaxInFlight > 0 {
		s += fmt.Sprintf("; maxInFlight: %d", f.MaxInFlight)
	}
	if f.MaxPerSecond > 0 {
		s += fmt.Sprintf("; maxPerSecond: %g", f.MaxPerSecond)
	}
	if f.TimeoutSeconds > 0 {
		s += fmt.Sprintf("; timeoutSeconds: %d", f.TimeoutSeconds)
	}
	return s
}

// declaring returns top with the forwarder named consumer declared on
// topic when the registry holds one there (so a backfill may deliver the
// topic's history to it, from the point an operator chooses), else top.
func (fa *forwarderAPI) declaring(ctx context.Context, top *topology.Topology, topic, consumer string) *topology.Topology {
	if top == nil || names.ValidateConsumer(consumer) != nil {
		return top
	}
	db, err := fa.db()
	if err != nil {
		return top
	}
	f, err := forwarders.Get(ctx, db, consumer)
	if err != nil || f.Topic != topic {
		return top
	}
	cp := *top
	cp.Topics = append([]topology.Topic(nil), top.Topics...)
	for i := range cp.Topics {
		if cp.Topics[i].Name == topic {
			cp.Topics[i].Consumers = append(append([]topology.Consumer(nil), cp.Topics[i].Consumers...), f.Consumer(top))
		}
	}
	return &cp
}
