package consume

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/delivery"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/instance"
)

// The registered function builds itself from the environment (migrations
// included) and applies a push delivery; an unknown handler name is refused
// with the names it knows.
func TestServeFromEnvironment(t *testing.T) {
	if os.Getenv("PUBSUB_EMULATOR_HOST") == "" {
		t.Skip("PUBSUB_EMULATOR_HOST is not set (make test starts the emulator)")
	}
	_, schema := pgtest.SchemaConfig(t, nil)
	t.Setenv("GOOGLE_CLOUD_PROJECT", fmt.Sprintf("consume-env-%d", time.Now().UnixNano()))
	t.Setenv("DATABASE_URL", pgtest.SchemaURL(t, schema))
	t.Setenv("LEDGER", "off")
	t.Setenv("CONSUMER_ID", "audit-service")
	t.Setenv("CONSUMER_HANDLER", "strict")
	srv := httptest.NewServer(instance.Lazy("consume", fromEnv))
	defer srv.Close()
	e := &event.Event{Type: "points.added", Source: "member-service", Topic: "member.points.events", AggregateID: "m-1",
		Version: 1, Payload: []byte(`{"balance":10}`)}
	_ = e.Prepare(time.Now(), event.Limits{})
	m, _ := event.Encode(e, event.EncodingJSON)
	m.ID = "msg-1"
	resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(delivery.WrappedBody(m, "member.points.events.audit-service-recorder", 1)))
	if err != nil {
		t.Fatal(err)
	}
	var res consumer.Result
	_ = json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if resp.StatusCode != 200 || res.Outcome != "success" {
		t.Fatalf("env-built consume: %d %+v", resp.StatusCode, res)
	}
	if _, err := BuildHandler("nope", HandlerConfig{}); err == nil || !bytes.Contains([]byte(err.Error()), []byte(`CONSUMER_HANDLER="nope": unknown handler; known: `)) ||
		!bytes.Contains([]byte(err.Error()), []byte("forward, projection, strict")) {
		t.Errorf("unknown handler: %v", err)
	}
}
