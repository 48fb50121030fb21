package pgpool

import "testing"

func TestStatementNamesAreLowCardinality(t *testing.T) {
	for sql, want := range map[string]string{
		"-- Enqueue: insert the events (an id already in the outbox is skipped) and,\n-- in the same statement\nWITH ins AS (...)": "pg Enqueue",
		"-- Claim re-pushes: lease up to $3 due re-pushes\nWITH t AS (SELECT 1)":                                                   "pg Claim re-pushes",
		"-- a comment without a name\nSELECT id FROM relaybus_outbox WHERE id = 'e-123'":                                           "pg SELECT",
		"  insert into t values (1)": "pg INSERT",
		"begin":                      "pg BEGIN",
		"SELECT count(*) FROM t":     "pg SELECT",
		"":                           "pg",
	} {
		if got := StatementName(sql); got != want {
			t.Errorf("%q: %q, want %q", sql, got, want)
		}
	}
}
