package instance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/relaybus/relaybus/internal/logging"
)

// This file holds what the host shares with every function and opens no
// backend. Each backend has an opener package of its own, so a binary
// links only those its function's configuration names:
// internal/instance/pgopen (Postgres pools and migrations),
// internal/instance/fsopen (the ledger and Firestore clients) and
// internal/instance/brokeropen (Pub/Sub or NATS JetStream, as TRANSPORT
// names).

// Logger returns the function's logger: LogHandler's when set, else JSON
// lines on stderr at LogLevel with Cloud Logging's trace correlation for
// the project.
func (e Env) Logger() *slog.Logger {
	if e.LogHandler != nil {
		return slog.New(e.LogHandler)
	}
	return logging.New(os.Stderr, logging.Options{Level: logging.ParseLevel(e.LogLevel), ProjectID: e.ProjectID})
}

// Transports TRANSPORT names (brokeropen.Open opens them).
const (
	TransportPubSub = "pubsub"
	TransportNATS   = "nats"
)

// Ledger modes LEDGER names: the same values as internal/ledger's
// ModeFirestore and ModeOff (a test in fsopen ties them), declared here so
// that a function that only says whether it records (consume) reads its
// configuration without the ledger's Firestore package.
const (
	LedgerFirestore = "firestore"
	LedgerOff       = "off"
)

// Check refuses a Mode other than firestore and off, naming LEDGER.
func (r Recording) Check() error {
	switch r.Mode {
	case LedgerOff, LedgerFirestore, "":
		return nil
	}
	return fmt.Errorf("LEDGER=%q: want %s or %s", r.Mode, LedgerFirestore, LedgerOff)
}

// On reports whether the ledger is recorded (Mode is not off).
func (r Recording) On() bool { return r.Mode != LedgerOff }

// Closers closes what a constructor opened, last first: a function's
// Close, or the clean-up of a constructor that failed half-way.
type Closers []func(context.Context) error

// Add appends a close function.
func (c *Closers) Add(f func(context.Context) error) { *c = append(*c, f) }

// Close runs them all, last added first, and joins their errors.
func (c Closers) Close(ctx context.Context) error {
	var errs []error
	for i := len(c) - 1; i >= 0; i-- {
		errs = append(errs, c[i](ctx))
	}
	return errors.Join(errs...)
}
