// Package fsopen is the host's Firestore opener: the ledger's store
// (instance.Ledger, instance.Recorder) and a Firestore client on another
// database of the project (the operators' audit log). It is a package of
// its own so that a binary whose function opens no Firestore client links
// only the backends it uses (internal/instance/pgopen for Postgres,
// internal/instance/brokeropen for the broker).
package fsopen

import (
	"context"
	"fmt"
	"math"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/privacy"
)

// Ledger opens the ledger of project with l's settings; opts carries the
// caller's own (its logger, the topology's levels).
func Ledger(ctx context.Context, l instance.Ledger, project string, opts ledger.Options) (*ledger.Store, error) {
	opts.Retention = l.Retention
	opts.ReconcileAfter = l.ReconcileAfter
	if opts.PrivacyKey.IsZero() {
		k, err := privacy.ConfiguredKey(l.PrivacyKey, opts.Privacy, opts.Logger)
		if err != nil {
			return nil, err
		}
		opts.PrivacyKey = k
	}
	client, closeConn, err := clientOptions(l)
	if err != nil {
		return nil, err
	}
	s, err := ledger.Open(ctx, ledger.Config{ProjectID: project, Database: l.Database}, opts, client...)
	if err != nil {
		closeConn()
		return nil, err
	}
	return s, nil
}

// Recorder opens the ledger unless r.Mode is off (then it returns nil and
// no error): publish's and the relay's, which write it themselves.
func Recorder(ctx context.Context, r instance.Recorder, project string, opts ledger.Options) (*ledger.Store, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	if !r.On() {
		return nil, nil
	}
	return Ledger(ctx, r.Ledger, project, opts)
}

// Client opens a Firestore client on another database of the project
// (the emulator's when l.EmulatorHost is set), for the operators' audit
// log's database of its own. The caller closes it.
func Client(ctx context.Context, l instance.Ledger, project, database string) (*firestore.Client, error) {
	client, closeConn, err := clientOptions(l)
	if err != nil {
		return nil, err
	}
	c, err := firestore.NewClientWithDatabase(ctx, project, database, client...)
	if err != nil {
		closeConn()
		return nil, fmt.Errorf("firestore client for %s/%s: %w", project, database, err)
	}
	return c, nil
}

// clientOptions are the Firestore client's options: none in production.
// closeConn closes the emulator's connection they carry, for a caller
// whose client could not be made; a client that was closes it itself.
func clientOptions(l instance.Ledger) (_ []option.ClientOption, closeConn func(), _ error) {
	if l.EmulatorHost == "" {
		return nil, func() {}, nil
	}
	// What the Firestore client does with FIRESTORE_EMULATOR_HOST (no
	// TLS, the emulator's admin credentials "Bearer owner"), on a
	// connection of our own passed last, so that it wins: when the
	// process environment names an emulator, firestore.NewClient
	// dials that one first and would ignore an endpoint option, so a
	// test or the local stack that runs its own emulator beside the
	// environment's would write to one and read from the other. The
	// client closes the connection with it.
	conn, err := grpc.NewClient(l.EmulatorHost,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(emulatorOwner{}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32)))
	if err != nil {
		return nil, nil, fmt.Errorf("config: FIRESTORE_EMULATOR_HOST=%q: %w", l.EmulatorHost, err)
	}
	return []option.ClientOption{option.WithGRPCConn(conn)}, func() { _ = conn.Close() }, nil
}

// emulatorOwner authenticates to the Firestore emulator as its admin.
type emulatorOwner struct{}

func (emulatorOwner) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer owner"}, nil
}

func (emulatorOwner) RequireTransportSecurity() bool { return false }
