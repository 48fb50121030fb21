// Package pack carries several messages of one ordering key, addressed to
// one consumer, as one broker message: a backfill's or an operator's
// re-pushes of an aggregate's versions travel a message per run of them,
// not one each, and the consumer applies a pack in one transaction.
//
// A pack's attributes are Attr (how many messages it carries, as a
// decimal), the target consumer and the content type; its data is a JSON
// array of the messages, each its attributes and its data, in order. The
// pack's own ordering key, topic, message id, publish time and delivery
// attempt are its messages': a message's id is the pack's followed by
// "/" and its position from 0.
package pack

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// Attr is the attribute that marks a pack: how many messages it carries.
const Attr = "relaybus_pack"

// contentType is a pack's content-type attribute.
const contentType = "application/vnd.relaybus.pack+json"

// Bounds of a pack.
const (
	// MaxMessages is the most messages a pack carries.
	MaxMessages = 1000
	// MaxBytes bounds the attributes and data of a pack's messages
	// together, well inside the smallest broker's message limit (NATS's
	// default 1 MiB; Pub/Sub's is 10 MB).
	MaxBytes = 256 << 10
)

// item is one message in a pack's data.
type item struct {
	Attributes map[string]string `json:"attributes"`
	Data       []byte            `json:"data"`
}

// Size is what m counts against MaxBytes.
func Size(m event.Message) int {
	n := len(m.Data)
	for k, v := range m.Attributes {
		n += len(k) + len(v)
	}
	return n
}

// Is reports whether m is a pack.
func Is(m event.Message) bool {
	_, ok := m.Attributes[Attr]
	return ok
}

// Encode returns the pack of msgs (at least one): they must share their
// ordering key and target consumer, and be within MaxMessages and MaxBytes.
func Encode(msgs []event.Message) (event.Message, error) {
	if len(msgs) == 0 || len(msgs) > MaxMessages {
		return event.Message{}, fmt.Errorf("pack: %d messages: a pack carries 1 to %d", len(msgs), MaxMessages)
	}
	key, target := msgs[0].OrderingKey, msgs[0].Attributes[topology.TargetConsumerAttr]
	items := make([]item, len(msgs))
	size := 0
	for i, m := range msgs {
		if m.OrderingKey != key || m.Attributes[topology.TargetConsumerAttr] != target {
			return event.Message{}, fmt.Errorf("pack: message %d has ordering key %q and %s %q: a pack's messages share the first's (%q, %q)",
				i, m.OrderingKey, topology.TargetConsumerAttr, m.Attributes[topology.TargetConsumerAttr], key, target)
		}
		if Is(m) {
			return event.Message{}, fmt.Errorf("pack: message %d is a pack: packs do not nest", i)
		}
		size += Size(m)
		items[i] = item{Attributes: m.Attributes, Data: m.Data}
	}
	if size > MaxBytes {
		return event.Message{}, fmt.Errorf("pack: %d bytes of messages: a pack carries at most %d", size, MaxBytes)
	}
	data, err := json.Marshal(items)
	if err != nil {
		return event.Message{}, fmt.Errorf("pack: %w", err)
	}
	attrs := map[string]string{Attr: strconv.Itoa(len(msgs)), event.AttrContentType: contentType}
	if target != "" {
		attrs[topology.TargetConsumerAttr] = target
	}
	return event.Message{Topic: msgs[0].Topic, OrderingKey: key, Attributes: attrs, Data: data}, nil
}

// ErrMalformed is a pack that cannot be read (a *event.DecodeError with
// reason event.ReasonMalformed wraps it).
var ErrMalformed = errors.New("pack: malformed")

// Decode returns the messages of pack p, in order. A pack whose count or
// data cannot be read is a *event.DecodeError (reason malformed) naming
// what is wrong.
func Decode(p event.Message) ([]event.Message, error) {
	bad := func(format string, a ...any) error {
		return &event.DecodeError{Reason: event.ReasonMalformed, Err: fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, a...))}
	}
	n, err := strconv.Atoi(p.Attributes[Attr])
	if err != nil || n < 1 || n > MaxMessages {
		return nil, bad("attribute %s is %q: it must be a count from 1 to %d", Attr, p.Attributes[Attr], MaxMessages)
	}
	var items []item
	if err := json.Unmarshal(p.Data, &items); err != nil {
		return nil, bad("data: %v", err)
	}
	if len(items) != n {
		return nil, bad("data holds %d messages and attribute %s says %d", len(items), Attr, n)
	}
	out := make([]event.Message, n)
	for i, it := range items {
		if it.Attributes == nil {
			return nil, bad("message %d has no attributes", i)
		}
		if _, nested := it.Attributes[Attr]; nested {
			return nil, bad("message %d is a pack: packs do not nest", i)
		}
		m := p
		m.ID = p.ID + "/" + strconv.Itoa(i)
		m.Attributes, m.Data = it.Attributes, it.Data
		out[i] = m
	}
	return out, nil
}
