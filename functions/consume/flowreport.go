package consume

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"os"
	"time"

	"github.com/relaybus/relaybus/internal/flow"
	"github.com/relaybus/relaybus/internal/inbox"
	"github.com/relaybus/relaybus/shared/postgres"
)

// DefaultFlowReportEvery is how often a consume instance writes its flow
// report when it was at a limit since the last one (FlowLimits.ReportEvery).
const DefaultFlowReportEvery = 5 * time.Second

// instanceName names this process in its flow reports: the Cloud Run
// revision (K_REVISION) and a random suffix.
var instanceName = func() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	rev := os.Getenv("K_REVISION")
	if rev == "" {
		rev = "local"
	}
	return rev + "-" + hex.EncodeToString(b[:])
}()

// reportFlow writes the instance's flow report (inbox.ReportFlow) each
// every while it was at one of gate's limits since the last report, and
// nothing while it was not, until ctx ends. A failed write is logged and
// tried again at the next tick.
func reportFlow(ctx context.Context, db postgres.DBTX, consumerID string, gate *flow.Gate, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	var reported time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s := gate.State()
		at := s.LastAtLimit
		if s.AtLimit {
			at = time.Now()
		}
		if !at.After(reported) {
			continue
		}
		if err := inbox.ReportFlow(ctx, db, consumerID, inbox.FlowReport{Instance: instanceName, AtLimitAt: at, Refused: s.Refused}); err != nil {
			if ctx.Err() == nil {
				log.WarnContext(ctx, "consume: flow report not written", "consumer", consumerID, "error", err.Error())
			}
			continue
		}
		reported = at
	}
}
