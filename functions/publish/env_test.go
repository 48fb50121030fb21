package publish

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/pgtest"
	"github.com/relaybus/relaybus/shared/instance"
	"github.com/relaybus/relaybus/shared/topology"
	"github.com/relaybus/relaybus/shared/transport"
)

// The registered function builds itself from the environment: outbox,
// topology registry (LEDGER=off) and the fast path to the Pub/Sub emulator.
func TestServeFromEnvironment(t *testing.T) {
	if os.Getenv("PUBSUB_EMULATOR_HOST") == "" {
		t.Skip("PUBSUB_EMULATOR_HOST is not set (make test starts the emulator)")
	}
	_, schema := pgtest.SchemaConfig(t, nil)
	project := fmt.Sprintf("publish-env-%d", time.Now().UnixNano())
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	ps, err := transport.New(context.Background(), project, transport.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	if err := transport.Provision(context.Background(), ps, top, transport.ProvisionOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOOGLE_CLOUD_PROJECT", project)
	t.Setenv("DATABASE_URL", pgtest.SchemaURL(t, schema))
	t.Setenv("LEDGER", "off")
	srv := httptest.NewServer(instance.Lazy("publish", fromEnv))
	defer srv.Close()
	body := `{"eventType":"order.purchased","topic":"shop.order.events","aggregateId":"order-1","version":1,"source":"order-service","payload":{"n":1}}`
	resp, err := http.Post(srv.URL, "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res Result
	_ = json.NewDecoder(resp.Body).Decode(&res)
	if resp.StatusCode != http.StatusAccepted || res.Status != StatusPublished {
		t.Fatalf("env-built publish: %d %+v, want 202 published", resp.StatusCode, res)
	}
}
