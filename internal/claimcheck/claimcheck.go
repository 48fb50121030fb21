// Package claimcheck moves the data of messages over a size threshold out
// of the broker and into an object store, and back (the claim-check
// pattern).
//
// The relay (and publish's fast path, which is the relay's code) calls
// [Checker.Offload] on every encoded message: one whose data is over the
// threshold is stored under <topic>/<event id> and sent with its
// attributes only, plus event.AttrClaimCheck naming the object, its size
// and its SHA-256. The consumer engine calls [Checker.Fetch] on every
// message before it decodes it: a message that names an object gets the
// object's bytes back as its data, checked against the size and digest,
// so handlers see the whole payload. An object that is missing or altered
// is a *event.DecodeError with Reason event.ReasonClaimCheck (the consumer
// dead-letters the message, naming the reference); a store that fails is
// a plain error (the consumer asks for redelivery).
//
// The object's key is deterministic, so a publish that is retried, or an
// event re-pushed, writes the same object again. The outbox keeps the
// payload itself: the object is a copy for the broker's readers, deleted
// by the bucket's lifecycle rule (infra/terraform) or by [Checker.Delete]
// (erasure).
//
// The stores are [Dir] (a directory, for the local stack and tests) and
// the Cloud Storage store in internal/instance/claimopen, which is where
// the Cloud Storage client is linked: a binary that does not open a claim
// check store links no storage client because of this package.
package claimcheck

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/relaybus/relaybus/shared/event"
)

// ErrNotFound is matched by a Store's Get of an object that does not exist.
var ErrNotFound = errors.New("claimcheck: object not found")

// Store keeps the claim-checked objects. Keys are <topic>/<event id>.
type Store interface {
	// Put writes data under key, replacing what is there.
	Put(ctx context.Context, key string, data []byte) error
	// Get reads the object under key; a missing one is an error matching
	// ErrNotFound.
	Get(ctx context.Context, key string) ([]byte, error)
	// Delete removes the object under key; a missing one is not an error.
	Delete(ctx context.Context, key string) error
	// Ref is the reference a message carries for key: a URL such as
	// gs://bucket/key or file:///dir/key.
	Ref(key string) string
}

// DefaultThreshold is the data size over which a message travels by claim
// check when Options.Threshold is zero (1 MiB; see docs/producing.md,
// "Large payloads", for the arithmetic).
const DefaultThreshold = 1 << 20

// Options configure a Checker.
type Options struct {
	// Store keeps the objects (required).
	Store Store
	// Threshold is the largest message data that travels inline
	// (DefaultThreshold when zero); larger data is stored. It is capped at
	// event.MaxPayloadLimit plus the envelope's room, since Pub/Sub takes no
	// more.
	Threshold int
}

// Checker offloads large messages to a Store and fetches them back. It is
// safe for concurrent use.
type Checker struct {
	store     Store
	threshold int
}

// New returns a Checker over o.
func New(o Options) (*Checker, error) {
	if o.Store == nil {
		return nil, errors.New("claimcheck: Options.Store is required")
	}
	if o.Threshold < 0 {
		return nil, fmt.Errorf("claimcheck: the threshold must be 0 (the default, %d bytes) to %d bytes (got %d)",
			DefaultThreshold, event.PubSubMaxMessageBytes, o.Threshold)
	}
	if o.Threshold == 0 {
		o.Threshold = DefaultThreshold
	}
	o.Threshold = min(o.Threshold, event.PubSubMaxMessageBytes)
	return &Checker{store: o.Store, threshold: o.Threshold}, nil
}

// Threshold is the largest message data that travels inline.
func (c *Checker) Threshold() int { return c.threshold }

// Key is the object key of topic's event id.
func Key(topic, eventID string) string { return topic + "/" + eventID }

// Offload returns m unchanged when its data is at most the threshold;
// otherwise it stores the data under Key(topic, event id) and returns m
// without data, its attributes copied with the reference, size and
// SHA-256 added. A message without an event_id attribute cannot be keyed
// and is an error.
func (c *Checker) Offload(ctx context.Context, topic string, m event.Message) (event.Message, error) {
	if len(m.Data) <= c.threshold {
		return m, nil
	}
	id := m.Attributes[event.AttrEventID]
	if id == "" {
		return m, fmt.Errorf("claimcheck: a %d-byte message to %s has no %s attribute to key its object by", len(m.Data), topic, event.AttrEventID)
	}
	key := Key(topic, id)
	if err := c.store.Put(ctx, key, m.Data); err != nil {
		return m, fmt.Errorf("claimcheck: store %d bytes of event %s at %s: %w", len(m.Data), id, c.store.Ref(key), err)
	}
	sum := sha256.Sum256(m.Data)
	out := m
	out.Data = nil
	out.Attributes = make(map[string]string, len(m.Attributes)+3)
	maps.Copy(out.Attributes, m.Attributes)
	out.Attributes[event.AttrClaimCheck] = c.store.Ref(key)
	out.Attributes[event.AttrClaimCheckSize] = strconv.Itoa(len(m.Data))
	out.Attributes[event.AttrClaimCheckSHA256] = hex.EncodeToString(sum[:])
	return out, nil
}

// Fetch returns m with its data read back from the store when m names a
// claim-checked object (event.AttrClaimCheck), and m unchanged otherwise.
// A reference outside this Checker's store, a missing object, or one whose
// size or SHA-256 differs from the message's is a *event.DecodeError with
// Reason event.ReasonClaimCheck that names the reference; a failing store
// is a plain error (worth retrying).
func (c *Checker) Fetch(ctx context.Context, m event.Message) (event.Message, error) {
	ref := m.Attributes[event.AttrClaimCheck]
	if ref == "" {
		return m, nil
	}
	key, ok := strings.CutPrefix(ref, c.store.Ref(""))
	if !ok || key == "" {
		return m, poison(fmt.Errorf("the reference %s is not in this consumer's claim-check store %s", ref, c.store.Ref("")))
	}
	data, err := c.store.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return m, poison(fmt.Errorf("the claim-checked object %s does not exist (deleted by retention or erasure, or never written): %w", ref, err))
	}
	if err != nil {
		return m, fmt.Errorf("claimcheck: read %s: %w", ref, err)
	}
	if want := m.Attributes[event.AttrClaimCheckSize]; want != "" && want != strconv.Itoa(len(data)) {
		return m, poison(fmt.Errorf("the claim-checked object %s is %d bytes, the message says %s", ref, len(data), want))
	}
	sum := sha256.Sum256(data)
	if want := m.Attributes[event.AttrClaimCheckSHA256]; want != "" && want != hex.EncodeToString(sum[:]) {
		return m, poison(fmt.Errorf("the claim-checked object %s has SHA-256 %x, the message says %s", ref, sum, want))
	}
	m.Data = data
	return m, nil
}

// Delete removes the object of topic's event id, if any: the step erasure
// takes for an event that travelled by claim check.
func (c *Checker) Delete(ctx context.Context, topic, eventID string) error {
	key := Key(topic, eventID)
	if err := c.store.Delete(ctx, key); err != nil {
		return fmt.Errorf("claimcheck: delete %s: %w", c.store.Ref(key), err)
	}
	return nil
}

func poison(err error) error {
	return &event.DecodeError{Reason: event.ReasonClaimCheck, Err: err}
}
