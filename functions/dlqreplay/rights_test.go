package dlqreplay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/option"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/emutest"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ledger/consumers"
	"github.com/relaybus/relaybus/internal/registry"
)

// reply is one call's status and JSON body.
type reply struct {
	status int
	body   map[string]any
	raw    string
	header http.Header
}

// as calls the API with the ID token Cloud Run would hand on for email.
func (e *env) as(t *testing.T, email, method, path string, body any) reply {
	t.Helper()
	var rd *bytes.Reader
	if b, ok := body.([]byte); ok {
		rd = bytes.NewReader(b)
	} else if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, e.url+path, rd)
	req.Header.Set("Authorization", "Bearer "+cloudRunToken(person(email)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	a := reply{status: resp.StatusCode, raw: buf.String(), header: resp.Header}
	_ = json.Unmarshal(buf.Bytes(), &a.body)
	return a
}

const monitorSA = "relaybus-dlq-push@relaybus-prod.iam.gserviceaccount.com"

// teams is a service behind Cloud Run with one admin (alice), a viewer
// (bob), an operator of the order topic (olga) and an operator of the
// audit-service consumer (carl), and the DLQ monitors' push identity.
func teams(o *dlqreplay.Options) {
	behindCloudRun(o)
	o.Archivers = []string{monitorSA}
	o.Roles = append(o.Roles,
		dlqreplay.Binding{Member: "user:olga@example.com", Role: dlqreplay.RoleOperator, Topics: []string{"shop.order.events"}},
		dlqreplay.Binding{Member: "carl@example.com", Role: dlqreplay.RoleOperator, Consumers: []string{"audit-service"}})
}

// Roles are scoped: an operator of a topic acts on its letters and
// consumers, an operator of a consumer on that consumer's, on any topic;
// anything else is refused 403 naming the missing right, recorded in the
// audit log. Disabling a topic's last enabled consumer is an admin's, and
// the reply says what becomes of the topic's new events.
func TestRolesAreScopedToTopicsAndConsumers(t *testing.T) {
	e := newEnvWith(t, teams)
	if _, err := consumers.New(e.store.Client(), consumers.Options{}).SyncConsumers(context.Background(), registry.Consumers(e.top), consumers.SyncOptions{}); err != nil {
		t.Fatal(err)
	}
	if a := e.as(t, monitorSA, "POST", "/deadletters:archive", archiveBody("dl-order")); a.status != 200 {
		t.Fatalf("archive: %d %s", a.status, a.raw)
	}
	// carl operates audit-service only: not member-service's letter.
	a := e.as(t, "carl@example.com", "DELETE", "/deadletters/dl-order", nil)
	if a.status != 403 || a.body["code"] != "forbidden" {
		t.Fatalf("carl deletes member-service's letter: %d %s, want 403", a.status, a.raw)
	}
	missing, _ := a.body["missing"].(map[string]any)
	if missing["role"] != "operator" || missing["topic"] != "shop.order.events" || missing["consumer"] != "member-service" ||
		!strings.Contains(a.body["message"].(string), "operator role on consumer member-service of shop.order.events") {
		t.Errorf("the 403 names %v / %q, want the operator role on member-service of shop.order.events", missing, a.body["message"])
	}
	if a := e.as(t, "bob@example.com", "DELETE", "/deadletters/dl-order", nil); a.status != 403 {
		t.Errorf("a viewer deletes: %d", a.status)
	}
	// Bulk replays: the filter must be within the caller's scope.
	for _, c := range []struct {
		who    string
		filter map[string]any
		want   int
	}{
		{"carl@example.com", map[string]any{"topic": "shop.order.events"}, 403},
		{"carl@example.com", map[string]any{"consumer": "audit-service"}, 200},
		{"olga@example.com", map[string]any{"consumer": "audit-service"}, 403},
		{"olga@example.com", map[string]any{"topic": "shop.order.events"}, 200},
		{"olga@example.com", map[string]any{"reason": "x"}, 403}, // every topic
		{"alice@example.com", map[string]any{"reason": "x"}, 200},
	} {
		if a := e.as(t, c.who, "POST", "/deadletters:replay", c.filter); a.status != c.want {
			t.Errorf("%s replays %v: %d %s, want %d", c.who, c.filter, a.status, a.raw, c.want)
		}
	}
	if a := e.as(t, "olga@example.com", "DELETE", "/deadletters/dl-order", nil); a.status != 200 {
		t.Errorf("olga deletes her topic's letter: %d %s", a.status, a.raw)
	}
	if a := e.as(t, "carl@example.com", "POST", "/subscriptions/member.points.events.audit-service-recorder:seek", map[string]any{"time": "2026-01-01T00:00:00Z"}); a.status == 403 {
		t.Errorf("carl seeks audit-service's subscription: 403 %s", a.raw)
	}
	if a := e.as(t, "carl@example.com", "POST", "/subscriptions/shop.order.events.member-service-processor:seek", map[string]any{"time": "2026-01-01T00:00:00Z"}); a.status != 403 {
		t.Errorf("carl seeks member-service's subscription: %d, want 403", a.status)
	}
	if a := e.as(t, "olga@example.com", "POST", "/consumers", map[string]any{"topic": "shop.order.events", "consumerId": "x-service"}); a.status != 403 {
		t.Errorf("an operator adds a consumer: %d, want 403 (an admin's)", a.status)
	}

	// Disabling: one of two is an operator's; the last is an admin's.
	if a := e.as(t, "olga@example.com", "POST", "/consumers/shop.order.events/message-service:disable", nil); a.status != 200 || a.body["newEvents"] != nil {
		t.Fatalf("olga disables message-service: %d %s", a.status, a.raw)
	}
	a = e.as(t, "olga@example.com", "POST", "/consumers/shop.order.events/member-service:disable", nil)
	if missing, _ := a.body["missing"].(map[string]any); a.status != 403 || missing["role"] != "admin" || missing["topic"] != "shop.order.events" {
		t.Fatalf("olga disables the last consumer: %d %s, want 403 naming admin on shop.order.events", a.status, a.raw)
	}
	if a := e.as(t, "olga@example.com", "GET", "/consumers?topic=shop.order.events", nil); !strings.Contains(a.raw, `"consumerId":"member-service","enabled":true`) {
		t.Fatalf("the refused disable changed the registry: %s", a.raw)
	}
	a = e.as(t, "alice@example.com", "POST", "/consumers/shop.order.events/member-service:disable", nil)
	if a.status != 200 || !strings.Contains(fmt.Sprint(a.body["newEvents"]), "SKIPPED") {
		t.Fatalf("the admin disables the last consumer: %d %s, want 200 saying new events are SKIPPED", a.status, a.raw)
	}
	entries, err := e.store.Audit().List(context.Background(), audit.Query{ActionPrefix: audit.ConsumerDisable, Limit: 20})
	if err != nil {
		t.Fatal(err)
	}
	var refusedOlga, aliceDone bool
	for _, x := range entries {
		refusedOlga = refusedOlga || (x.By == "olga@example.com" && x.Outcome == audit.OutcomeRefused && x.ConsumerID == "" && x.Topic == "shop.order.events")
		aliceDone = aliceDone || (x.By == "alice@example.com" && x.Outcome == audit.OutcomeSucceeded && strings.Contains(x.Detail, "no enabled consumer left") && x.Ref != "")
	}
	if !refusedOlga || !aliceDone {
		t.Errorf("audit %+v: want olga's refusal and alice's disable saying no consumer is left", entries)
	}
}

// whoami tells a caller their own roles, never who else may do what.
func TestWhoamiShowsOnlyTheCallersRoles(t *testing.T) {
	e := newEnvWith(t, teams)
	a := e.as(t, "carl@example.com", "GET", "/whoami", nil)
	if a.status != 200 || a.body["canWrite"] != true {
		t.Fatalf("whoami: %d %s", a.status, a.raw)
	}
	roles, _ := a.body["roles"].([]any)
	if len(roles) != 1 || !strings.Contains(a.raw, `"consumers":["audit-service"]`) {
		t.Errorf("carl's roles %v, want operator of audit-service", roles)
	}
	for _, other := range []string{"alice@example.com", "olga@example.com", "bob@example.com", monitorSA} {
		if strings.Contains(a.raw, other) {
			t.Errorf("whoami tells carl about %s: %s", other, a.raw)
		}
	}
	if a := e.as(t, "bob@example.com", "GET", "/whoami", nil); a.body["canWrite"] != false || strings.Contains(a.raw, "alice") {
		t.Errorf("the viewer's whoami: %s", a.raw)
	}
}

// flakyAudit is the ledger's audit log with a switch that makes appends
// fail, as a Firestore outage or a denied write would.
type flakyAudit struct {
	dlqreplay.AuditLog
	down atomic.Bool
}

func (f *flakyAudit) Append(ctx context.Context, e audit.Entry) (audit.Entry, error) {
	if f.down.Load() {
		return audit.Entry{}, errors.New("audit store unavailable")
	}
	return f.AuditLog.Append(ctx, e)
}

// The audit log holds: an action whose entry cannot be written is not
// taken (503 audit_unavailable), nor is a payload read answered; actions,
// payload reads and refusals are recorded with the identity the API
// verified, how it was verified, and the request.
func TestAuditLogHolds(t *testing.T) {
	var flaky *flakyAudit
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		teams(o)
		flaky = &flakyAudit{AuditLog: o.Ledger.Audit()}
		o.Audit = flaky
	})
	for _, id := range []string{"dl-a", "dl-b"} {
		if a := e.as(t, monitorSA, "POST", "/deadletters:archive", archiveBody(id)); a.status != 200 {
			t.Fatalf("archive: %d %s", a.status, a.raw)
		}
	}
	flaky.down.Store(true)
	for _, c := range []struct{ method, path string }{
		{"DELETE", "/deadletters/dl-a"},
		{"POST", "/deadletters/dl-a:replay"},
		{"POST", "/consumers/shop.order.events/message-service:disable"},
		{"GET", "/deadletters/dl-a"},
	} {
		if a := e.as(t, "alice@example.com", c.method, c.path, nil); a.status != 503 || a.body["code"] != "audit_unavailable" {
			t.Errorf("%s %s with the audit log down: %d %s, want 503 audit_unavailable", c.method, c.path, a.status, a.raw)
		}
	}
	if l, err := e.archive.Get(context.Background(), "dl-a"); err != nil || l.Deleted || len(l.Replays) != 0 {
		t.Errorf("an unaudited action was taken: %+v %v", l, err)
	}
	if n := len(e.fake.Server.Messages()); n != 0 {
		t.Errorf("an unaudited replay published %d messages", n)
	}
	if a := e.as(t, "alice@example.com", "GET", "/consumers?topic=shop.order.events", nil); !strings.Contains(a.raw, `"consumerId":"message-service","enabled":true`) {
		t.Errorf("an unaudited disable changed the registry: %s", a.raw)
	}

	flaky.down.Store(false)
	if a := e.as(t, "alice@example.com", "DELETE", "/deadletters/dl-a", nil); a.status != 200 {
		t.Fatalf("delete: %d %s", a.status, a.raw)
	}
	if a := e.as(t, "bob@example.com", "GET", "/deadletters/dl-b", nil); a.status != 200 {
		t.Fatalf("a viewer reads a letter: %d %s", a.status, a.raw)
	}
	if a := e.as(t, "bob@example.com", "POST", "/deadletters/dl-b:replay", nil); a.status != 403 {
		t.Fatalf("a viewer replays: %d", a.status)
	}
	// The list carries no payload: reading one is a recorded read.
	if a := e.as(t, "bob@example.com", "GET", "/deadletters", nil); a.status != 200 || strings.Contains(a.raw, `"data":"`) {
		t.Errorf("the listing: %d, carries message data: %s", a.status, a.raw)
	}
	entries, err := e.store.Audit().List(context.Background(), audit.Query{ActionPrefix: "deadletter.", Limit: 50})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]audit.Entry{}
	for _, x := range entries {
		got[x.Action+"/"+x.Outcome+"/"+x.By] = x
	}
	for _, want := range []string{
		"deadletter.delete/started/alice@example.com", "deadletter.delete/succeeded/alice@example.com",
		"deadletter.read/read/bob@example.com", "deadletter.replay/refused/bob@example.com",
	} {
		x, ok := got[want]
		if !ok {
			t.Errorf("no %s entry in %v", want, keys(got))
			continue
		}
		if x.Method != dlqreplay.AuthCloudRun || x.RequestID == "" {
			t.Errorf("%s: method %q request %q, want cloudrun and the request's id", want, x.Method, x.RequestID)
		}
	}
	if done, start := got["deadletter.delete/succeeded/alice@example.com"], got["deadletter.delete/started/alice@example.com"]; done.Ref != start.ID {
		t.Errorf("the outcome's ref %q, want the started entry %q", done.Ref, start.ID)
	}
}

func keys[V any](m map[string]V) []string {
	out := []string{}
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Each caller has its own budget: past it, 429 with Retry-After, and
// another caller goes on.
func TestOperatorsAPILimitsEachCaller(t *testing.T) {
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		behindCloudRun(o)
		o.RateLimit, o.RateBurst = 0.001, 2
	})
	for i := range 2 {
		if a := e.as(t, "bob@example.com", "GET", "/whoami", nil); a.status != 200 {
			t.Fatalf("request %d: %d", i+1, a.status)
		}
	}
	a := e.as(t, "bob@example.com", "GET", "/deadletters", nil)
	if a.status != 429 || a.body["code"] != "rate_limited" || a.header.Get("Retry-After") == "" {
		t.Fatalf("past the burst: %d (Retry-After %q) %s", a.status, a.header.Get("Retry-After"), a.raw)
	}
	if a := e.as(t, "alice@example.com", "GET", "/whoami", nil); a.status != 200 {
		t.Errorf("another caller: %d", a.status)
	}
}

// Roles granted to a group reach its members, as the Cloud Identity Groups
// API says (the real client against a fake of its two calls); a member is
// looked up once per TTL, and an API that fails grants nothing.
func TestGroupRoles(t *testing.T) {
	var lookups, checks atomic.Int64
	var broken atomic.Bool
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if broken.Load() {
			http.Error(w, `{"error": {"code": 503, "message": "unavailable"}}`, http.StatusServiceUnavailable)
			return
		}
		switch {
		case r.URL.Path == "/v1/groups:lookup" && r.URL.Query().Get("groupKey.id") == "ops@example.com":
			lookups.Add(1)
			_, _ = fmt.Fprint(w, `{"name": "groups/03ops"}`)
		case r.URL.Path == "/v1/groups/03ops/memberships:checkTransitiveMembership":
			checks.Add(1)
			_, _ = fmt.Fprintf(w, `{"hasMembership": %v}`, r.URL.Query().Get("query") == "member_key_id == 'dana@example.com'")
		default:
			http.Error(w, `{"error": {"code": 404, "message": "not found"}}`, 404)
		}
	}))
	t.Cleanup(api.Close)
	groups, err := dlqreplay.NewCloudIdentityGroups(context.Background(), time.Hour, option.WithEndpoint(api.URL), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		behindCloudRun(o)
		o.Roles = []dlqreplay.Binding{{Member: "group:ops@example.com", Role: dlqreplay.RoleViewer}}
		o.Groups = groups
	})
	for range 2 {
		if a := e.as(t, "dana@example.com", "GET", "/deadletters", nil); a.status != 200 {
			t.Fatalf("a member of ops: %d %s", a.status, a.raw)
		}
	}
	if a := e.as(t, "eve@example.com", "GET", "/deadletters", nil); a.status != 403 {
		t.Errorf("not a member: %d", a.status)
	}
	if lookups.Load() != 1 || checks.Load() != 2 {
		t.Errorf("%d lookups, %d checks; want 1 and 2 (dana once, eve once)", lookups.Load(), checks.Load())
	}
	broken.Store(true)
	if a := e.as(t, "frank@example.com", "GET", "/deadletters", nil); a.status != 403 {
		t.Errorf("with Cloud Identity down: %d, want 403 (closed)", a.status)
	}
}

// With the audit log in a Firestore database of its own (production's),
// a registry change is recorded there and nowhere else: the started entry
// before the change, and its succeeded outcome, carrying what changed,
// after the change committed.
func TestARegistryChangeIsAuditedInTheAuditDatabase(t *testing.T) {
	ctx := context.Background()
	var (
		auditLog     *audit.Log
		ledgerClient *firestore.Client
	)
	e := newEnvWith(t, func(o *dlqreplay.Options) {
		teams(o)
		// The ledger on a project of its own, beside its audit database.
		project := emutest.FirestoreProject(t)
		c, err := firestore.NewClientWithDatabase(ctx, project, "relaybus-audit")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		auditLog = audit.New(c, nil)
		store, err := ledger.Open(ctx, ledger.Config{ProjectID: project}, ledger.Options{Audit: auditLog, Registry: registry.FromTopology(o.Topology)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		if _, err := consumers.New(store.Client(), consumers.Options{}).SyncConsumers(ctx, registry.Consumers(o.Topology), consumers.SyncOptions{}); err != nil {
			t.Fatal(err)
		}
		o.Ledger, ledgerClient = store, store.Client()
	})
	if a := e.as(t, "alice@example.com", "POST", "/consumers/shop.order.events/message-service:disable", nil); a.status != 200 || a.body["changed"] != true {
		t.Fatalf("disable: %d %s", a.status, a.raw)
	}
	entries, err := auditLog.List(ctx, audit.Query{ActionPrefix: "consumer.", Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	byOutcome := map[string]audit.Entry{}
	for _, en := range entries {
		byOutcome[en.Outcome] = en
	}
	started, done := byOutcome[audit.OutcomeStarted], byOutcome[audit.OutcomeSucceeded]
	if len(entries) != 2 || started.ID == "" || done.Ref != started.ID || done.By != "alice@example.com" || done.Detail != "enabled: true → false" {
		t.Errorf("the audit database holds %+v, want the disable started and succeeded (enabled: true → false) by alice", entries)
	}
	if inLedger, err := audit.New(ledgerClient, nil).List(ctx, audit.Query{}); err != nil || len(inLedger) != 0 {
		t.Errorf("the ledger's database holds audit entries %+v (%v)", inLedger, err)
	}
}
