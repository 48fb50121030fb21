// Package claimopen is the host's claim-check opener: the store
// instance.ClaimCheck names, a Cloud Storage bucket or a local directory. It
// is a package of its own so that only the binaries whose functions
// publish or consume events (publish, relay, consume) link the Cloud
// Storage client; rollup and dlqreplay do not (internal/layering).
package claimopen

import (
	"context"
	"errors"
	"fmt"
	"io"

	"cloud.google.com/go/storage"

	"github.com/relaybus/relaybus/internal/claimcheck"
	"github.com/relaybus/relaybus/internal/instance"
)

// Open returns the Checker c configures, and what to call at shutdown;
// nil and a no-op when c names no store. Both CLAIM_CHECK_BUCKET and
// CLAIM_CHECK_DIR set is an error naming them.
func Open(ctx context.Context, c instance.ClaimCheck) (*claimcheck.Checker, func() error, error) {
	none := func() error { return nil }
	var (
		store   claimcheck.Store
		closeFn = none
	)
	switch {
	case c.Bucket != "" && c.Dir != "":
		return nil, none, errors.New("config: set CLAIM_CHECK_BUCKET or CLAIM_CHECK_DIR, not both")
	case c.Bucket != "":
		client, err := storage.NewClient(ctx)
		if err != nil {
			return nil, none, fmt.Errorf("config: CLAIM_CHECK_BUCKET=%s: %w", c.Bucket, err)
		}
		store, closeFn = NewGCS(client, c.Bucket), client.Close
	case c.Dir != "":
		d, err := claimcheck.NewDir(c.Dir)
		if err != nil {
			return nil, none, fmt.Errorf("config: CLAIM_CHECK_DIR: %w", err)
		}
		store = d
	default:
		return nil, none, nil
	}
	ch, err := claimcheck.New(claimcheck.Options{Store: store, Threshold: c.Threshold})
	if err != nil {
		_ = closeFn()
		return nil, none, fmt.Errorf("config: CLAIM_CHECK_THRESHOLD: %w", err)
	}
	return ch, closeFn, nil
}

// GCS is a claimcheck.Store in a Cloud Storage bucket: the object
// <topic>/<event id> is gs://<bucket>/<topic>/<event id>.
type GCS struct {
	bucket string
	b      *storage.BucketHandle
}

// NewGCS returns a store in bucket through client.
func NewGCS(client *storage.Client, bucket string) *GCS {
	return &GCS{bucket: bucket, b: client.Bucket(bucket)}
}

// object is key's handle. A key's bytes never change (the encoded event
// of one event id), so every call may be retried, writes included.
func (g *GCS) object(key string) *storage.ObjectHandle {
	return g.b.Object(key).Retryer(storage.WithPolicy(storage.RetryAlways))
}

// Put uploads data under key in one request.
func (g *GCS) Put(ctx context.Context, key string, data []byte) error {
	w := g.object(key).NewWriter(ctx)
	w.ChunkSize = 0 // one request: the data is in memory already
	w.ContentType = "application/octet-stream"
	if _, err := w.Write(data); err != nil {
		_ = w.Close()
		return err
	}
	return w.Close()
}

// Get downloads the object under key.
func (g *GCS) Get(ctx context.Context, key string) ([]byte, error) {
	r, err := g.object(key).NewReader(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return nil, fmt.Errorf("%w: %s", claimcheck.ErrNotFound, g.Ref(key))
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// Delete deletes the object under key; a missing one is not an error.
func (g *GCS) Delete(ctx context.Context, key string) error {
	if err := g.object(key).Delete(ctx); err != nil && !errors.Is(err, storage.ErrObjectNotExist) {
		return err
	}
	return nil
}

// Ref is gs://<bucket>/<key>.
func (g *GCS) Ref(key string) string { return "gs://" + g.bucket + "/" + key }
