package devstack

import (
	"fmt"
	neturl "net/url"
	"strconv"
	"strings"
)

// DefaultPostgresBudget is the most Postgres connections the local stack
// holds at once, all its pools together, whatever the load: it fits a
// Postgres with the default max_connections (100) with room for psql, the
// demo, a load generator and other clients.
const DefaultPostgresBudget = 40

// poolRole is what a pool of the stack serves; each role's pools get a
// share of the budget in proportion to its weight.
type poolRole int

const (
	// roleAdmin: one per database, for migrations, the scheduler's
	// helpers and tests (Stack.Pools).
	roleAdmin poolRole = iota
	// roleOps: one per database, dlqreplay's own (it is a function of its
	// own, built by its Build from its URLs).
	roleOps
	// roleRelay: one per database; its drain runs relay.DefaultConcurrency
	// workers, the fast path and the kicks.
	roleRelay
	// rolePublish: the publish function's outbox.
	rolePublish
	// roleConsumer: one per enabled consumer.
	roleConsumer
)

// roleWeight and roleMin: each role's relative share, and the least a pool
// of it may get.
var (
	roleWeight = map[poolRole]int{roleAdmin: 2, roleOps: 1, roleRelay: 4, rolePublish: 8, roleConsumer: 4}
	roleMin    = map[poolRole]int{roleAdmin: 1, roleOps: 1, roleRelay: 2, rolePublish: 2, roleConsumer: 2}
)

// poolShares splits budget among the stack's pools (one admin, one
// dlqreplay and one relay pool per database, one publish pool, one pool per
// consumer and one for the forwarders service) in proportion to their
// roles' weights, rounding down, what is
// left to publish, so the sum is budget. With the default topology (2
// databases, 4 consumers and the forwarders service: 5 consumer pools) and
// the default 40: admin 1, dlqreplay 1, relay 3, publish 15, consumer 3.
// Publish weighs most: its requests have the shortest budget (2 s), while
// a delivery may wait for a connection up to the consumer's 30 s.
func poolShares(budget, databases, consumers int) (map[poolRole]int, error) {
	count := map[poolRole]int{roleAdmin: databases, roleOps: databases, roleRelay: databases, rolePublish: 1, roleConsumer: consumers}
	weights, least := 0, 0
	for r, n := range count {
		weights += n * roleWeight[r]
		least += n * roleMin[r]
	}
	if budget < least {
		return nil, fmt.Errorf("PostgresBudget: %d connections cannot serve %d databases and %d consumers: it must be at least %d", budget, databases, consumers, least)
	}
	shares := map[poolRole]int{}
	total := 0
	for r, n := range count {
		shares[r] = max(roleMin[r], budget*roleWeight[r]/weights)
		total += n * shares[r]
	}
	// What rounding down left goes to publish, whose requests have the
	// shortest budget; the minimums may instead have pushed the sum over:
	// take back from the largest shares first.
	shares[rolePublish] += budget - total
	total = budget
	if shares[rolePublish] < roleMin[rolePublish] {
		total += roleMin[rolePublish] - shares[rolePublish]
		shares[rolePublish] = roleMin[rolePublish]
	}
	for total > budget {
		top := roleAdmin
		for r := range count {
			if count[r] > 0 && shares[r]-roleMin[r] > shares[top]-roleMin[top] {
				top = r
			}
		}
		shares[top]--
		total -= count[top]
	}
	return shares, nil
}

// withPoolMaxConns returns url with pgx's pool_max_conns set to n, the
// way a function's DATABASE_URL carries its pool size in production.
func withPoolMaxConns(url string, n int) (string, error) {
	if u, err := neturl.Parse(url); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("pool_max_conns", strconv.Itoa(n))
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	if strings.Contains(url, "=") { // key=value form
		var kept []string
		for _, f := range strings.Fields(url) {
			if !strings.HasPrefix(f, "pool_max_conns=") {
				kept = append(kept, f)
			}
		}
		return strings.Join(append(kept, "pool_max_conns="+strconv.Itoa(n)), " "), nil
	}
	return "", fmt.Errorf("DATABASE_URL: want a postgres:// URL or key=value settings")
}
