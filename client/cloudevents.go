package client

import (
	"encoding/base64"
	"encoding/json"
	"mime"
	"net/http"
	"time"

	"github.com/relaybus/relaybus/shared/event"
)

// Media types of CloudEvents' JSON format and its batch form.
const (
	mediaTypeCloudEventsJSON  = "application/cloudevents+json"
	mediaTypeCloudEventsBatch = "application/cloudevents-batch+json"
)

// structured is one event in the CloudEvents JSON format
// (https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/formats/json-format.md):
// its context and extension attributes as strings, and the payload as
// data (an application/json or text/json payload, inline) or data_base64
// (any other payload type, a +json one included: the CloudEvents SDK that
// publish reads the format with takes inline data as JSON for those two
// types only, and data_base64 for every type). The client writes the
// format itself so that it links no CloudEvents SDK.
func structured(e *event.Event) map[string]any {
	m := make(map[string]any, 24)
	for k, v := range attributes(e) {
		m[k] = v
	}
	if e.Payload != nil {
		if inlineJSON(e.PayloadType) {
			m["data"] = json.RawMessage(e.Payload)
		} else {
			m["data_base64"] = base64.StdEncoding.EncodeToString(e.Payload)
		}
	}
	return m
}

// inlineJSON reports whether a payload of this media type goes inline as
// data in the JSON format: application/json (the default) and text/json,
// whatever their parameters.
func inlineJSON(mediaType string) bool {
	if mediaType == "" || mediaType == event.DefaultPayloadType {
		return true
	}
	mt, _, err := mime.ParseMediaType(mediaType)
	if err != nil {
		return false
	}
	return mt == "application/json" || mt == "text/json"
}

// binaryHeaders are the headers of an event in CloudEvents binary mode
// over HTTP
// (https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/bindings/http-protocol-binding.md):
// each attribute as a ce-<name> header, datacontenttype as Content-Type;
// the body is the payload as it is.
func binaryHeaders(e *event.Event) http.Header {
	h := http.Header{}
	for k, v := range attributes(e) {
		if k == "datacontenttype" {
			h.Set("Content-Type", v)
			continue
		}
		h.Set("ce-"+k, v)
	}
	return h
}

// attributes are the event's CloudEvents attributes as publish reads them:
// the event's own, and deliverat when it is scheduled (an instruction to
// the outbox, which the event does not carry on Pub/Sub).
func attributes(e *event.Event) map[string]string {
	a := e.CloudEventAttributes()
	if !e.DeliverAt.IsZero() {
		a[event.ExtDeliverAt] = e.DeliverAt.UTC().Format(time.RFC3339Nano)
	}
	return a
}
