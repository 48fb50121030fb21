package devstack

import (
	"context"
	"errors"
	"sync"
)

// services are the servers the stack runs on: each one the environment
// names, or one the stack started.
type services struct {
	Postgres  postgresServer
	Firestore firestoreServer
	Broker    brokerServer
	// Started says what was started, one line each.
	Started []string
}

// startServices starts what o does not name, at once (Postgres and the
// Firestore emulator take a second or two each), and returns when every
// one has started or failed: a failure waits for the others, so that what
// they started is in down when the failed Start stops it.
func startServices(ctx context.Context, o Options, lb localBroker, down *teardown) (services, error) {
	var (
		sv           services
		wg           sync.WaitGroup
		pgErr, fsErr error
	)
	wg.Go(func() { sv.Postgres, pgErr = startPostgres(ctx, o.DatabaseURL, o.StateDir, o.DurablePostgres, down) })
	wg.Go(func() { sv.Firestore, fsErr = startFirestore(ctx, o.FirestoreHost, down) })
	var brErr error
	sv.Broker, brErr = lb.serve(ctx, o, down)
	wg.Wait()
	if err := errors.Join(pgErr, fsErr, brErr); err != nil {
		return services{}, err
	}
	for _, line := range []string{sv.Postgres.Started, sv.Firestore.Started, sv.Broker.Started} {
		if line != "" {
			sv.Started = append(sv.Started, line)
		}
	}
	return sv, nil
}
