package pack_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/internal/pack"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

func msg(key, target string, v int) event.Message {
	attrs := map[string]string{event.AttrEventID: fmt.Sprintf("%s-v%d", key, v), event.AttrVersion: fmt.Sprint(v)}
	if target != "" {
		attrs[topology.TargetConsumerAttr] = target
	}
	return event.Message{Topic: "shop.order.events", OrderingKey: key, Attributes: attrs, Data: []byte(fmt.Sprintf(`{"v":%d}`, v))}
}

func TestEncodeDecodeKeepsEachMessageInOrder(t *testing.T) {
	msgs := []event.Message{msg("order-a", "new-service", 1), msg("order-a", "new-service", 2), msg("order-a", "new-service", 3)}
	p, err := pack.Encode(msgs)
	if err != nil {
		t.Fatal(err)
	}
	if !pack.Is(p) || p.OrderingKey != "order-a" || p.Attributes[topology.TargetConsumerAttr] != "new-service" || p.Attributes[pack.Attr] != "3" {
		t.Fatalf("pack %+v: want a pack of 3 keyed order-a addressed to new-service", p)
	}
	p.ID, p.DeliveryAttempt = "m-9", 4
	got, err := pack.Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("decoded %d messages, want 3", len(got))
	}
	for i, m := range got {
		want := msgs[i]
		if m.ID != fmt.Sprintf("m-9/%d", i) || m.DeliveryAttempt != 4 || m.OrderingKey != "order-a" || m.Topic != want.Topic ||
			string(m.Data) != string(want.Data) || m.Attributes[event.AttrEventID] != want.Attributes[event.AttrEventID] {
			t.Errorf("message %d decoded as %+v, want %+v with id m-9/%d and the pack's delivery attempt", i, m, want, i)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	big := msg("order-a", "c", 2)
	big.Data = make([]byte, pack.MaxBytes)
	nested, err := pack.Encode([]event.Message{msg("order-a", "c", 1)})
	if err != nil {
		t.Fatal(err)
	}
	many := make([]event.Message, pack.MaxMessages+1)
	for i := range many {
		many[i] = msg("order-a", "c", i+1)
	}
	for _, tc := range []struct {
		name string
		msgs []event.Message
		want string
	}{
		{"none", nil, "a pack carries 1 to"},
		{"too many", many, "a pack carries 1 to"},
		{"two keys", []event.Message{msg("order-a", "c", 1), msg("order-b", "c", 1)}, "share the first's"},
		{"two targets", []event.Message{msg("order-a", "c", 1), msg("order-a", "d", 2)}, "share the first's"},
		{"too large", []event.Message{msg("order-a", "c", 1), big}, "at most"},
		{"nested", []event.Message{nested}, "packs do not nest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := pack.Encode(tc.msgs); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Encode: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

func TestDecodeRefusesAMalformedPack(t *testing.T) {
	good, err := pack.Encode([]event.Message{msg("order-a", "c", 1), msg("order-a", "c", 2)})
	if err != nil {
		t.Fatal(err)
	}
	with := func(count string, data string) event.Message {
		m := good
		m.Attributes = map[string]string{pack.Attr: count}
		m.Data = []byte(data)
		return m
	}
	for _, tc := range []struct {
		name string
		m    event.Message
		want string
	}{
		{"count not a number", with("two", string(good.Data)), pack.Attr},
		{"count zero", with("0", "[]"), pack.Attr},
		{"count disagrees", with("3", string(good.Data)), "data holds 2 messages"},
		{"data not JSON", with("2", "{"), "data"},
		{"no attributes", with("1", `[{"data":"e30="}]`), "message 0 has no attributes"},
		{"nested", with("1", `[{"attributes":{"relaybus_pack":"1"},"data":""}]`), "packs do not nest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pack.Decode(tc.m)
			var de *event.DecodeError
			if !errors.As(err, &de) || de.Reason != event.ReasonMalformed || !errors.Is(err, pack.ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Decode: %v, want a malformed DecodeError saying %q", err, tc.want)
			}
		})
	}
	if msgs, err := pack.Decode(good); err != nil || !slices.EqualFunc(msgs, []int{1, 2}, func(m event.Message, v int) bool { return m.Attributes[event.AttrVersion] == fmt.Sprint(v) }) {
		t.Errorf("the good pack: %v %v", msgs, err)
	}
}
