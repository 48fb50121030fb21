package claimcheck_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/internal/claimcheck"
	"github.com/relaybus/relaybus/shared/event"
)

func checker(t *testing.T, threshold int) (*claimcheck.Checker, *claimcheck.Dir) {
	t.Helper()
	d, err := claimcheck.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := claimcheck.New(claimcheck.Options{Store: d, Threshold: threshold})
	if err != nil {
		t.Fatal(err)
	}
	return c, d
}

func msg(id string, n int) event.Message {
	return event.Message{Data: bytes.Repeat([]byte("x"), n), OrderingKey: "A-1",
		Attributes: map[string]string{event.AttrEventID: id, event.AttrAggregateID: "A-1"}}
}

// At or below the threshold the data stays in the message; above it the
// message carries the reference, size and digest, and its other
// attributes, and Fetch gives the data back.
func TestOffloadOnlyOverTheThreshold(t *testing.T) {
	ctx := context.Background()
	c, d := checker(t, 100)
	for _, tc := range []struct {
		name    string
		n       int
		claimed bool
	}{{"empty", 0, false}, {"at the threshold", 100, false}, {"one byte over", 101, true}, {"12 MB", 12 << 20, true}} {
		t.Run(tc.name, func(t *testing.T) {
			in := msg("e-"+strings.ReplaceAll(tc.name, " ", "-"), tc.n)
			out, err := c.Offload(ctx, "shop.order.events", in)
			if err != nil {
				t.Fatal(err)
			}
			ref := out.Attributes[event.AttrClaimCheck]
			if got := ref != ""; got != tc.claimed {
				t.Fatalf("claimed = %v, want %v (attributes %v)", got, tc.claimed, out.Attributes)
			}
			if !tc.claimed {
				if !bytes.Equal(out.Data, in.Data) {
					t.Fatal("inline data changed")
				}
				return
			}
			if len(out.Data) != 0 || out.Attributes[event.AttrAggregateID] != "A-1" || out.OrderingKey != "A-1" {
				t.Fatalf("claimed message: %d bytes of data, attributes %v, key %q", len(out.Data), out.Attributes, out.OrderingKey)
			}
			if _, ok := in.Attributes[event.AttrClaimCheck]; ok {
				t.Fatal("Offload changed the caller's attributes")
			}
			if want := d.Ref("shop.order.events/" + in.Attributes[event.AttrEventID]); ref != want {
				t.Fatalf("reference %q, want %q", ref, want)
			}
			back, err := c.Fetch(ctx, out)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back.Data, in.Data) {
				t.Fatalf("fetched %d bytes, not the %d offloaded", len(back.Data), len(in.Data))
			}
		})
	}
}

// An object that cannot be the message's data is poison naming the
// reference; a message without a reference passes through.
func TestFetchRefusesWhatIsNotTheData(t *testing.T) {
	ctx := context.Background()
	c, d := checker(t, 10)
	out, err := c.Offload(ctx, "shop.order.events", msg("e-1", 50))
	if err != nil {
		t.Fatal(err)
	}
	with := func(k, v string) event.Message {
		m := out
		m.Attributes = map[string]string{}
		for a, b := range out.Attributes {
			m.Attributes[a] = b
		}
		m.Attributes[k] = v
		return m
	}
	for name, tc := range map[string]struct {
		m    event.Message
		want string
	}{
		"size differs":     {with(event.AttrClaimCheckSize, "49"), "is 50 bytes, the message says 49"},
		"digest differs":   {with(event.AttrClaimCheckSHA256, strings.Repeat("0", 64)), "has SHA-256"},
		"another store":    {with(event.AttrClaimCheck, "gs://elsewhere/shop.order.events/e-1"), "not in this consumer's claim-check store"},
		"leaves the store": {with(event.AttrClaimCheck, d.Ref("../../etc/passwd")), "invalid object key"},
		"missing object":   {with(event.AttrClaimCheck, d.Ref("shop.order.events/e-2")), "does not exist"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := c.Fetch(ctx, tc.m)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Fetch: %v, want an error containing %q", err, tc.want)
			}
			var de *event.DecodeError
			if name != "leaves the store" && (!errors.As(err, &de) || de.Reason != event.ReasonClaimCheck) {
				t.Fatalf("Fetch: %v, want a decode error with reason %s", err, event.ReasonClaimCheck)
			}
			if name == "missing object" && !strings.Contains(err.Error(), tc.m.Attributes[event.AttrClaimCheck]) {
				t.Fatalf("Fetch: %v does not name the reference %s", err, tc.m.Attributes[event.AttrClaimCheck])
			}
		})
	}
	plain := msg("e-3", 5)
	if got, err := c.Fetch(ctx, plain); err != nil || !bytes.Equal(got.Data, plain.Data) {
		t.Fatalf("Fetch of an inline message: %v", err)
	}
}

func TestNewRefusesANegativeThreshold(t *testing.T) {
	d, err := claimcheck.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := claimcheck.New(claimcheck.Options{Store: d, Threshold: -1}); err == nil || !strings.Contains(err.Error(), "threshold") {
		t.Fatalf("New(-1): %v", err)
	}
	if _, err := claimcheck.New(claimcheck.Options{}); err == nil || !strings.Contains(err.Error(), "Store") {
		t.Fatalf("New without a store: %v", err)
	}
	c, err := claimcheck.New(claimcheck.Options{Store: d})
	if err != nil || c.Threshold() != claimcheck.DefaultThreshold {
		t.Fatalf("default threshold: %v, %v", c, err)
	}
}
