package instance_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/relaybus/relaybus/functions/consume"
	"github.com/relaybus/relaybus/functions/dlqreplay"
	"github.com/relaybus/relaybus/functions/publish"
	relayfn "github.com/relaybus/relaybus/functions/relay"
	"github.com/relaybus/relaybus/functions/rollup"
	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/claimcheck"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/otelsetup"
	"github.com/relaybus/relaybus/internal/pull"
	"github.com/relaybus/relaybus/internal/registry"
	"github.com/relaybus/relaybus/shared/consumer"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/forward"
	"github.com/relaybus/relaybus/shared/projection"
	"github.com/relaybus/relaybus/shared/relay"
	"github.com/relaybus/relaybus/shared/topology"
)

// A variable's default is written in its env tag; where the engine or a
// function's Options also fall back to a Default* constant when given
// nothing, the two are one value: each row is a tag's value as Defaults
// reads it beside the constant that says the same. A default tag with no
// row here must say why in writtenOnce.
func TestEachDefaultIsWrittenOnce(t *testing.T) {
	pub := instance.Defaults[publish.Config]()
	rel := instance.Defaults[relayfn.Config]()
	con := instance.Defaults[consume.Config]()
	rol := instance.Defaults[rollup.Config]()
	dlq := instance.Defaults[dlqreplay.Config]()
	mig := instance.Defaults[consume.MigrateConfig]()
	tied := []struct {
		variable      string
		tag, constant any
	}{
		{"SHUTDOWN_TIMEOUT", pub.ShutdownTimeout, instance.DefaultShutdownTimeout},
		{"FIRESTORE_DATABASE", rol.Ledger.Database, ledger.DefaultDatabase},
		{"LEDGER_RETENTION", rol.Ledger.Retention, ledger.DefaultRetention},
		{"LEDGER_RECONCILE_AFTER", rol.Ledger.ReconcileAfter, ledger.DefaultReconcileAfter},
		{"LEDGER_BUDGET", pub.Ledger.Budget, relay.DefaultLedgerBudget},
		{"LEDGER_BUDGET", pub.Ledger.Budget, consumer.DefaultLedgerBudget},
		{"LEDGER", pub.Ledger.Mode, ledger.ModeFirestore},
		{"TELEMETRY_EXPORT", pub.Telemetry.Export, otelsetup.ExportAuto},

		{"RELAY_BATCH_SIZE", rel.Relay.BatchSize, relay.DefaultBatchSize},
		{"RELAY_AGGREGATES", rel.Relay.Aggregates, relay.DefaultAggregates},
		{"RELAY_RUN_LIMIT", rel.Relay.RunLimit, relay.DefaultRunLimit},
		{"RELAY_CONCURRENCY", rel.Relay.Concurrency, relay.DefaultConcurrency},
		{"RELAY_LEASE", rel.Relay.Lease, relay.DefaultLease},
		{"RELAY_MAX_ATTEMPTS", rel.Relay.MaxAttempts, relay.DefaultMaxAttempts},
		{"RELAY_BACKOFF_BASE", rel.Relay.BackoffBase, relay.DefaultBackoffBase},
		{"RELAY_BACKOFF_MAX", rel.Relay.BackoffMax, relay.DefaultBackoffMax},
		{"OUTBOX_RETENTION", rel.Relay.Retention, relay.DefaultRetention},
		{"RELAY_HEAL_DELAY", rel.Relay.HealDelay, relay.DefaultHealDelay},
		{"RELAY_DATABASES", strings.Join(rel.Databases, ","), topology.MainDatabase},
		{"DLQREPLAY_FORWARDERS_DATABASE", dlq.ForwardersDatabase, topology.MainDatabase},
		{"MIGRATE_DATABASE", mig.Database, topology.MainDatabase},

		{"PUBLISH_MAX_PAYLOAD_BYTES", pub.MaxPayloadBytes, event.DefaultPayloadLimit},
		{"PUBLISH_BUDGET", pub.Budget, publish.DefaultBudget},
		{"PUBLISH_MAX_IN_FLIGHT", pub.MaxInFlight, publish.DefaultMaxInFlight},
		{"PUBLISH_RATE_LIMIT", pub.RateLimit, float64(publish.DefaultRateLimit)},
		{"PUBLISH_RATE_BURST", pub.RateBurst, publish.DefaultRateBurst},
		{"REGISTRY_CACHE_TTL", pub.RegistryTTL, registry.DefaultCacheTTL},
		{"CLAIM_CHECK_THRESHOLD", pub.ClaimCheck.Threshold, claimcheck.DefaultThreshold},

		{"CONSUMER_HANDLER", con.Handler, topology.HandlerProjection},
		{"CONSUMER_MODE", con.Mode, consume.ModePush},
		{"ROLLUP_MODE", rol.Mode, rollup.ModePush},
		{"ARCHIVE_MODE", dlq.ArchiveMode, dlqreplay.ArchiveModePush},
		{"FORWARD_AUTH", con.ForwardAuth, forward.AuthNone},
		{"FORWARD_TIMEOUT", con.ForwardTimeout, forward.DefaultTimeout},
		{"FORWARD_BREAKER_THRESHOLD", con.ForwardBreakerThreshold, forward.DefaultBreakerThreshold},
		{"FORWARD_BREAKER_COOLDOWN", con.ForwardBreakerCoolDown, forward.DefaultBreakerCoolDown},
		{"FORWARD_BREAKER_MAX_COOLDOWN", con.ForwardBreakerMaxCoolDown, forward.DefaultBreakerMaxCoolDown},
		{"FORWARD_BREAKER_THRESHOLD", con.ForwardBreakerThreshold, topology.DefaultForwardBreakerThreshold},
		{"FORWARD_BREAKER_COOLDOWN", con.ForwardBreakerCoolDown, time.Duration(topology.DefaultForwardBreakerCoolDownSeconds) * time.Second},
		{"FORWARD_BREAKER_MAX_COOLDOWN", con.ForwardBreakerMaxCoolDown, time.Duration(topology.DefaultForwardBreakerMaxCoolDownSeconds) * time.Second},
		{"FORWARD_TIMEOUT", con.ForwardTimeout, time.Duration(topology.DefaultForwardTimeoutSeconds) * time.Second},
		{"STRICT_GAP_TIMEOUT", con.GapTimeout, projection.DefaultGapTimeout},
		{"STRICT_GAP_TIMEOUT", con.GapTimeout, time.Duration(topology.DefaultGapTimeoutSeconds) * time.Second},
		{"CONSUMER_MAX_DELIVERY_ATTEMPTS", con.MaxDeliveryAttempts, consumer.DefaultMaxDeliveryAttempts},
		{"CONSUMER_MAX_DELIVERY_ATTEMPTS", con.MaxDeliveryAttempts, pull.DefaultMaxAttempts},
		{"INBOX_RETENTION", con.InboxRetention, consume.DefaultInboxRetention},
		{"PULL_MAX_IN_FLIGHT", con.PullMaxInFlight, pull.DefaultMaxInFlight},
		{"CONSUMER_FLOW_WAIT", con.FlowWait, consume.DefaultFlowWait},
		{"ROLLUP_TOPIC", con.RollupTopic, ledger.DefaultRollupTopic},

		{"ROLLUP_WINDOW", rol.Window, rollup.DefaultWindow},
		{"ROLLUP_WRITE_GAP", rol.WriteGap, rollup.DefaultWriteGap},

		{"DLQREPLAY_AUTH", dlq.Auth, dlqreplay.AuthIAM},
		{"DLQREPLAY_RATE_LIMIT", dlq.RateLimit, float64(dlqreplay.DefaultRateLimit)},
		{"DLQREPLAY_RATE_BURST", dlq.RateBurst, dlqreplay.DefaultRateBurst},
		{"ARCHIVE_RETENTION", dlq.Retention, archive.DefaultRetention},
		{"DLQREPLAY_MAX_REPUSHES", dlq.MaxRepushes, dlqreplay.DefaultMaxRepushes},
		{"DLQREPLAY_SENT_TIMEOUT", dlq.SentTimeout, dlqreplay.DefaultSentTimeout},
	}
	covered := map[string]bool{}
	for _, r := range tied {
		covered[r.variable] = true
		if fmt.Sprint(r.tag) != fmt.Sprint(r.constant) {
			t.Errorf("%s: the tag's default is %v, the constant's %v", r.variable, r.tag, r.constant)
		}
	}
	// Defaults written in the tag alone: nothing else falls back to a value.
	writtenOnce := map[string]string{
		"LOG_LEVEL":           "the logger's level; logging.ParseLevel reads anything else as info",
		"TRANSPORT":           "the broker's name",
		"RELAY_TIME_BUDGET":   "only the relay function bounds a drain",
		"PUBLISH_FAST_PATH":   "a switch",
		"DLQREPLAY_READ_ONLY": "a switch",
	}
	for fn, typ := range map[string]reflect.Type{
		"publish": reflect.TypeOf(publish.Config{}), "relay": reflect.TypeOf(relayfn.Config{}),
		"consume": reflect.TypeOf(consume.Config{}), "rollup": reflect.TypeOf(rollup.Config{}),
		"dlqreplay": reflect.TypeOf(dlqreplay.Config{}), "migrate": reflect.TypeOf(consume.MigrateConfig{}),
	} {
		walk(typ, func(_ reflect.Type, f reflect.StructField, name string) {
			if !strings.Contains(f.Tag.Get("env"), "default=") || covered[name] {
				return
			}
			if _, ok := writtenOnce[name]; !ok {
				t.Errorf("%s: %s has a default tag this test does not tie to a constant nor list as written once", fn, name)
			}
		})
	}
}
