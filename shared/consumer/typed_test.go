package consumer

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/sourcecontextpb"

	"github.com/relaybus/relaybus/shared/event"
)

type orderV1 struct {
	MemberID string  `json:"memberId"`
	Amount   float64 `json:"amount"`
	Lines    []struct {
		SKU string `json:"sku"`
	} `json:"lines"`
}

// Decode reads JSON into a struct (ignoring fields added later) and
// protobuf into a message; a payload that does not fit is poison with a
// *PayloadError naming the field and the rule.
func TestDecode(t *testing.T) {
	pb, _ := proto.Marshal(&sourcecontextpb.SourceContext{FileName: "a.proto"})
	ev := func(payloadType, payload string) *event.Event {
		return &event.Event{Type: "order.purchased", SchemaVersion: "v1", PayloadType: payloadType, Payload: []byte(payload)}
	}
	for _, c := range []struct {
		name  string
		e     *event.Event
		proto bool
		field string // "" when it decodes
		want  string // what decoded
	}{
		{"json", ev("application/json", `{"memberId":"m-1","amount":4.5,"addedInV1_1":true}`), false, "", "m-1"},
		{"json wrong type", ev("application/json", `{"memberId":7}`), false, "payload.memberId", ""},
		{"json nested wrong type", ev("application/json", `{"lines":[{"sku":1}]}`), false, "payload.lines.sku", ""},
		{"json broken", ev("application/json", `{"memberId":`), false, "payload", ""},
		{"not json", ev("application/octet-stream", `xyz`), false, "payloadType", ""},
		{"protobuf", ev("application/protobuf", string(pb)), true, "", "a.proto"},
		{"protobuf as json", ev("application/json", `{"fileName":"b.proto","unknown":1}`), true, "", "b.proto"},
		{"protobuf broken", ev("application/protobuf", "\xff\xff"), true, "payload", ""},
	} {
		var (
			got string
			err error
		)
		if c.proto {
			var m *sourcecontextpb.SourceContext
			m, err = Decode[*sourcecontextpb.SourceContext](c.e)
			got = m.GetFileName()
		} else {
			var o orderV1
			o, err = Decode[orderV1](c.e)
			got = o.MemberID
		}
		if c.field == "" {
			if err != nil || got != c.want {
				t.Errorf("%s: got %q, %v; want %q", c.name, got, err, c.want)
			}
			continue
		}
		var pe *PayloadError
		class, code := Classify(err)
		if !errors.As(err, &pe) || pe.Field != c.field || pe.Rule == "" || class != ClassPoison || code != "bad_payload" {
			t.Errorf("%s: %v; want poison bad_payload naming %s", c.name, err, c.field)
		} else if !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: the message %q does not name %s", c.name, err, c.field)
		}
	}
}
