// Package postgres is the name relaybus's own packages use for the
// statement handle shared/postgres declares.
package postgres

import "github.com/relaybus/relaybus/shared/postgres"

// DBTX is shared/postgres.DBTX.
type DBTX = postgres.DBTX
