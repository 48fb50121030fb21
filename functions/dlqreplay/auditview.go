package dlqreplay

import "github.com/relaybus/relaybus/internal/ledger/audit"

// auditView serves GET /audit: the audit log's entries, newest first
// (who did, was refused or read what; auditlog.go writes them).
type auditView struct {
	log AuditLog
}

func (av *auditView) list(r *request, _ []string) (any, error) {
	q := newQuery(r.Request, "action", "topic", "consumer", "outcome", "limit")
	aq := audit.Query{
		ActionPrefix: q.str("action", func(s string) bool { return charset(s, 64, "._") }, "an action or its prefix: at most 64 characters of [a-z._] (consumer., deadletter.replay, ...)"),
		Topic:        q.topic("topic"), ConsumerID: q.consumer("consumer"), Limit: q.integer("limit", 1, audit.MaxScan),
		Outcome: q.str("outcome", func(s string) bool {
			return s == audit.OutcomeStarted || s == audit.OutcomeSucceeded || s == audit.OutcomeFailed || s == audit.OutcomeRefused || s == audit.OutcomeRead
		}, "started, succeeded, failed, refused or read"),
	}
	if err := q.err(); err != nil {
		return nil, err
	}
	entries, err := av.log.List(r.Context(), aq)
	if err != nil {
		return nil, err
	}
	return map[string]any{"entries": entries}, nil
}
