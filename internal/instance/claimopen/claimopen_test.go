package claimopen_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"github.com/fsouza/fake-gcs-server/fakestorage"

	"github.com/relaybus/relaybus/internal/claimcheck"
	"github.com/relaybus/relaybus/internal/instance"
	"github.com/relaybus/relaybus/internal/instance/claimopen"
	"github.com/relaybus/relaybus/shared/event"
)

// fakeGCS is an in-process Cloud Storage server (fake-gcs-server) with
// one bucket, and a store in it through the real storage client.
func fakeGCS(t *testing.T, bucket string) *claimopen.GCS {
	t.Helper()
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{NoListener: true,
		InitialObjects: []fakestorage.Object{{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: bucket, Name: "keep"}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return claimopen.NewGCS(srv.Client(), bucket)
}

// A 12 MB message goes to the bucket and comes back byte for byte through
// the Cloud Storage client; a missing object is ErrNotFound.
func TestGCSStoreRoundTrip(t *testing.T) {
	ctx := context.Background()
	g := fakeGCS(t, "claims")
	data := make([]byte, 12<<20)
	_, _ = rand.Read(data)
	ch, err := claimcheck.New(claimcheck.Options{Store: g})
	if err != nil {
		t.Fatal(err)
	}
	m := event.Message{Data: data, Attributes: map[string]string{event.AttrEventID: "e-1"}}
	out, err := ch.Offload(ctx, "shop.order.events", m)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := out.Attributes[event.AttrClaimCheck], "gs://claims/shop.order.events/e-1"; got != want {
		t.Fatalf("reference %q, want %q", got, want)
	}
	if len(out.Data) != 0 {
		t.Fatalf("the message still carries %d bytes", len(out.Data))
	}
	back, err := ch.Fetch(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Data, data) {
		t.Fatalf("fetched %d bytes that differ from the %d published", len(back.Data), len(data))
	}
	if err := ch.Delete(ctx, "shop.order.events", "e-1"); err != nil {
		t.Fatal(err)
	}
	if err := ch.Delete(ctx, "shop.order.events", "e-1"); err != nil {
		t.Fatalf("deleting a deleted object: %v", err)
	}
	_, err = ch.Fetch(ctx, out)
	var de *event.DecodeError
	if !errors.As(err, &de) || de.Reason != event.ReasonClaimCheck || !strings.Contains(err.Error(), "gs://claims/shop.order.events/e-1") {
		t.Fatalf("fetch after delete: %v, want a claim_check decode error naming the reference", err)
	}
	if _, err := g.Get(ctx, "shop.order.events/e-1"); !errors.Is(err, claimcheck.ErrNotFound) {
		t.Fatalf("Get of a missing object: %v, want ErrNotFound", err)
	}
}

func TestOpenRefusesBothStores(t *testing.T) {
	_, _, err := claimopen.Open(context.Background(), instance.ClaimCheck{Bucket: "b", Dir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "CLAIM_CHECK_BUCKET") || !strings.Contains(err.Error(), "CLAIM_CHECK_DIR") {
		t.Fatalf("Open with both: %v", err)
	}
	ch, closeFn, err := claimopen.Open(context.Background(), instance.ClaimCheck{})
	if err != nil || ch != nil {
		t.Fatalf("Open with neither: %v, %v", ch, err)
	}
	_ = closeFn()
	ch, closeFn, err = claimopen.Open(context.Background(), instance.ClaimCheck{Dir: t.TempDir(), Threshold: 100})
	if err != nil || ch == nil || ch.Threshold() != 100 {
		t.Fatalf("Open with a directory: %v, %v", ch, err)
	}
	_ = closeFn()
}
