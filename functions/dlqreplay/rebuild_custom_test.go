package dlqreplay_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/internal/pubsubtest"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/topology"
)

// A custom handler's rebuild: with the tables its state is in declared
// (rebuild_clear), the rebuild pauses the consumer (pull: its own flag),
// seeks, and clears those tables whole with its inbox; scoped to one
// aggregate type it is refused (the tables are cleared whole), and a
// custom handler that declares nothing is refused before anything is
// paused, seeked or cleared, saying what it cannot reset.
func TestRebuildACustomHandlerThatDeclaresItsTables(t *testing.T) {
	ctx := context.Background()
	src, err := os.ReadFile("../../infra/topology.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const points = "        handler: example.points\n"
	if !strings.Contains(string(src), points) {
		t.Fatal("infra/topology.yaml has no example.points consumer")
	}
	path := filepath.Join(t.TempDir(), "topology.yaml")
	if err := os.WriteFile(path, []byte(strings.Replace(string(src), points, points+"        rebuild_clear: [member_points]\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	declared, err := topology.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	const topic, id, sub = "shop.order.events", "member-service", "shop.order.events.member-service-processor"
	rec := &seekRecorder{}
	e := newEnv(t, dlqreplay.AuthNone, "")
	e.fake = pubsubtest.New(t, pstest.ServerReactorOption{FuncName: "Seek", Reactor: rec})
	e.fake.Provision(t, declared)
	undeclared := e.top
	e.top = declared
	e = newHandler(t, e, func(o *dlqreplay.Options) {
		o.Broker, o.PullConsumers, o.PauseSettle = e.fake.Client, []string{sub}, 10*time.Millisecond
	})
	if c, ok := declared.Consumer(sub); !ok || c.Service != id {
		t.Fatalf("the topology has no subscription %s of %s", sub, id)
	}
	if err := inbox.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	if err := projection.Migrate(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(ctx, `CREATE TABLE member_points (member_id text PRIMARY KEY, points int);
		INSERT INTO member_points VALUES ('m-1', 10), ('m-2', 20);
		INSERT INTO relaybus_inbox (consumer_id, event_id, attempt_no) VALUES ('member-service', 'e-1', 1), ('member-service', 'e-2', 1)`); err != nil {
		t.Fatal(err)
	}
	count := func(q string) int {
		var n int
		if err := e.db.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	base := "/consumers/" + topic + "/" + id + ":rebuild"
	hourAgo := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)

	var got map[string]any
	if code := e.call(t, "POST", base, map[string]any{"time": hourAgo, "dryRun": true}, &got); code != 200 {
		t.Fatalf("dry run: %d %v", code, got)
	}
	if w, _ := got["wouldClear"].(map[string]any); w == nil || w["tables"].(map[string]any)["member_points"] != float64(2) || w["inboxRows"] != float64(2) {
		t.Errorf("dry run would clear %v; want member_points' 2 rows and 2 inbox rows", got["wouldClear"])
	}
	var refused map[string]string
	if code := e.call(t, "POST", base, map[string]any{"time": hourAgo, "aggregateType": "member"}, &refused); code != 409 || refused["code"] != "scope" {
		t.Errorf("a custom handler's rebuild of one aggregate type: %d %v; want 409 scope", code, refused)
	}
	if code := e.call(t, "POST", base, map[string]any{"time": hourAgo}, &got); code != 200 {
		t.Fatalf("rebuild: %d %v", code, got)
	}
	if n, i, f := count(`SELECT count(*) FROM member_points`), count(`SELECT count(*) FROM relaybus_inbox WHERE consumer_id = 'member-service'`),
		count(`SELECT count(*) FROM relaybus_inbox_pause`); n != 0 || i != 0 || f != 0 {
		t.Errorf("after the rebuild: %d member_points rows, %d inbox rows, %d pauses standing; want none", n, i, f)
	}
	if len(rec.reqs) != 1 || !strings.HasSuffix(rec.reqs[0].GetSubscription(), "/"+sub) {
		t.Errorf("seek requests %v; want one of %s", rec.reqs, sub)
	}
	if d := strings.Join(strings.Fields(strings.Trim(strings.ReplaceAll(toString(got["done"]), ",", " "), "[]")), " "); !strings.Contains(d, "stops pulling") || !strings.Contains(d, "flag was lifted") {
		t.Errorf("the rebuild's done %q; want the pause and the resume said", d)
	}

	// Undeclared: refused before anything changes.
	rec.reqs = nil
	if _, err := e.db.Exec(ctx, `INSERT INTO member_points VALUES ('m-1', 10)`); err != nil {
		t.Fatal(err)
	}
	e.top = undeclared
	e = newHandler(t, e, func(o *dlqreplay.Options) { o.Broker, o.PullConsumers = e.fake.Client, []string{sub} })
	if code := e.call(t, "POST", base, map[string]any{"time": hourAgo}, &refused); code != 409 || refused["code"] != "handler" ||
		!strings.Contains(refused["message"], "cannot reset") || !strings.Contains(refused["message"], "rebuild_clear") {
		t.Errorf("an undeclared custom handler's rebuild: %d %v; want 409 saying what it cannot reset", code, refused)
	}
	if n, f := count(`SELECT count(*) FROM member_points`), count(`SELECT count(*) FROM relaybus_inbox_pause`); n != 1 || f != 0 || len(rec.reqs) != 0 {
		t.Errorf("a refused rebuild changed something: %d rows, %d pauses, seeks %v", n, f, rec.reqs)
	}
}

func toString(v any) string {
	if l, ok := v.([]any); ok {
		var s []string
		for _, x := range l {
			s = append(s, toString(x))
		}
		return strings.Join(s, "; ")
	}
	s, _ := v.(string)
	return s
}
