package consume

import "testing"

// The outage target (breaker_test.go) for the tests outside the package
// (which may import internal/devstack: it imports this package).

// OutageTarget is outageTarget.
type OutageTarget = outageTarget

// NewOutageTarget is newOutageTarget.
func NewOutageTarget(t *testing.T) *OutageTarget { return newOutageTarget(t) }

// Addr is the target's address.
func (tg *outageTarget) Addr() string { return tg.addr }

// Stop refuses connections until Start.
func (tg *outageTarget) Stop() { tg.stop() }

// Start serves again on the same address.
func (tg *outageTarget) Start(t *testing.T) { tg.start(t) }

// Accepted returns the event ids accepted, in order.
func (tg *outageTarget) Accepted() []string { return tg.accepted() }
