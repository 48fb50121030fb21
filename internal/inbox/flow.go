package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relaybus/relaybus/shared/postgres"
)

// A consumer's flow control as its instances report it (migration 010):
// only an instance knows whether it is holding deliveries to the
// consumer's limits, so each writes, after it was at one, when that was
// and how many deliveries it refused; the operators' API reads the rows
// to show whether the consumer is at its limits.

var (
	flowReportSQL  = query("flowreport")
	flowReportsSQL = query("flowreports")
)

// FlowReport is one consume instance's report of its flow control.
type FlowReport struct {
	// Instance names the consume instance.
	Instance string `json:"instance"`
	// AtLimitAt is when a delivery last had to wait for a limit or was
	// refused.
	AtLimitAt time.Time `json:"atLimitAt"`
	// Refused counts the deliveries the instance refused since it started.
	Refused int64 `json:"refused"`
	// UpdatedAt is when the instance wrote the report.
	UpdatedAt time.Time `json:"updatedAt"`
}

// ReportFlow writes instance's report for consumerID.
func ReportFlow(ctx context.Context, db postgres.DBTX, consumerID string, r FlowReport) error {
	if _, err := db.Exec(ctx, flowReportSQL, consumerID, r.Instance, r.AtLimitAt, r.Refused); err != nil {
		return fmt.Errorf("inbox: flow report of %s: %w", consumerID, err)
	}
	return nil
}

// FlowReports reads consumerID's instances' reports, the latest at a
// limit first.
func FlowReports(ctx context.Context, db postgres.DBTX, consumerID string) ([]FlowReport, error) {
	rows, err := db.Query(ctx, flowReportsSQL, consumerID)
	if err != nil {
		return nil, fmt.Errorf("inbox: flow reports of %s: %w", consumerID, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (FlowReport, error) {
		var r FlowReport
		err := row.Scan(&r.Instance, &r.AtLimitAt, &r.Refused, &r.UpdatedAt)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: flow reports of %s: %w", consumerID, err)
	}
	return out, nil
}
