package publish

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"sort"
	"strings"

	"github.com/cloudevents/sdk-go/v2/binding"
	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/traceparent"
	"github.com/relaybus/relaybus/shared/event"
)

// Request modes, as logged and as documented in the package doc.
const (
	ModeBinary        = "binary"         // CloudEvents binary mode: ce-* headers, the body is the payload
	ModeStructured    = "structured"     // CloudEvents structured mode: application/cloudevents+json (or +protobuf)
	ModeBatch         = "batch"          // CloudEvents batch mode: application/cloudevents-batch+json
	ModeEnvelope      = "envelope"       // plain JSON envelope object: application/json
	ModeEnvelopeBatch = "envelope-batch" // JSON array of plain envelopes: application/json
)

// item is one event of a request as decoded, with the problems decoding
// found. Validation adds its own problems later.
type item struct {
	ev   event.Event
	errs []*event.FieldError
	// whole is set when the item could not be decoded at all, so validating
	// the (empty) event would only add noise.
	whole bool
	// traceparent is the CloudEvents distributed-tracing extension, if any.
	traceparent string
}

// decoded is a request's events.
type decoded struct {
	mode  string
	batch bool
	items []item
}

// requestError is a request refused as a whole (not a field of an event).
type requestError struct {
	status int
	code   string
	msg    string
}

func (e *requestError) Error() string { return e.msg }

func malformed(format string, args ...any) *requestError {
	return &requestError{status: http.StatusBadRequest, code: CodeMalformed, msg: fmt.Sprintf(format, args...)}
}

// supportedTypes is quoted in 415 answers.
const supportedTypes = "application/cloudevents+json, application/cloudevents+protobuf, " +
	"application/cloudevents-batch+json, application/json (plain envelope or an array of them), " +
	"or any payload type in CloudEvents binary mode (ce-specversion, ce-id, ce-type, ce-source headers)"

// decode reads the events of a request whose body has already been read
// (and bounded). It uses the CloudEvents SDK's HTTP binding to tell the
// modes apart exactly as the SDK's own receivers do.
func decode(ctx context.Context, h http.Header, body []byte, maxBatch int) (*decoded, *requestError) {
	msg := cehttp.NewMessage(h, io.NopCloser(bytes.NewReader(body)))
	switch msg.ReadEncoding() {
	case binding.EncodingBinary:
		ce, err := binding.ToEvent(ctx, msg)
		if err != nil {
			return nil, malformed("CloudEvents binary mode: %v", err)
		}
		return &decoded{mode: ModeBinary, items: []item{fromCloudEvent(ce)}}, nil
	case binding.EncodingStructured:
		if len(bytes.TrimSpace(body)) == 0 {
			return nil, malformed("CloudEvents structured mode: the body is empty")
		}
		ce, err := binding.ToEvent(ctx, msg)
		if err != nil {
			return nil, malformed("CloudEvents structured mode: the body is not a CloudEvent in %s: %v", mediaType(h), err)
		}
		return &decoded{mode: ModeStructured, items: []item{fromCloudEvent(ce)}}, nil
	case binding.EncodingBatch:
		raws, rerr := splitArray(body, "CloudEvents batch mode", maxBatch)
		if rerr != nil {
			return nil, rerr
		}
		d := &decoded{mode: ModeBatch, batch: true, items: make([]item, len(raws))}
		for i, raw := range raws {
			var ce cloudevents.Event
			if err := json.Unmarshal(raw, &ce); err != nil {
				d.items[i] = item{whole: true, errs: []*event.FieldError{{Field: "event", Rule: "must be a CloudEvent in JSON format (" + err.Error() + ")"}}}
				continue
			}
			d.items[i] = fromCloudEvent(&ce)
		}
		return d, nil
	}
	if v := h.Get("Ce-Specversion"); v != "" {
		return nil, &requestError{status: http.StatusBadRequest, code: CodeInvalid,
			msg: fmt.Sprintf("ce-specversion: must be 1.0 or 0.3 (got %q)", v)}
	}
	mt := mediaType(h)
	if mt != "application/json" {
		if mt == "" {
			mt = "none"
		}
		return nil, &requestError{status: http.StatusUnsupportedMediaType, code: CodeUnsupportedMediaType,
			msg: "Content-Type " + mt + " is not supported; send " + supportedTypes}
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, malformed("the body is empty; send a JSON envelope object or an array of them")
	}
	if trimmed[0] == '[' {
		raws, rerr := splitArray(trimmed, "envelope batch", maxBatch)
		if rerr != nil {
			return nil, rerr
		}
		d := &decoded{mode: ModeEnvelopeBatch, batch: true, items: make([]item, len(raws))}
		for i, raw := range raws {
			d.items[i] = fromEnvelope(raw)
		}
		return d, nil
	}
	if trimmed[0] != '{' {
		return nil, malformed("the body is not a JSON object (an envelope) or array (a batch of envelopes)")
	}
	it := fromEnvelope(trimmed)
	if it.whole && len(it.errs) == 1 && it.errs[0].Field == "event" {
		return nil, malformed("the body %s", it.errs[0].Rule)
	}
	return &decoded{mode: ModeEnvelope, items: []item{it}}, nil
}

// splitArray splits a JSON array into its elements, refusing empty and
// oversized batches.
func splitArray(body []byte, what string, maxBatch int) ([]json.RawMessage, *requestError) {
	var raws []json.RawMessage
	if err := json.Unmarshal(body, &raws); err != nil {
		return nil, malformed("%s: the body must be a JSON array of events: %v", what, err)
	}
	if len(raws) == 0 {
		return nil, &requestError{status: http.StatusBadRequest, code: CodeInvalid, msg: "events: a batch must hold at least one event"}
	}
	if len(raws) > maxBatch {
		return nil, &requestError{status: http.StatusRequestEntityTooLarge, code: CodeTooLarge,
			msg: fmt.Sprintf("events: at most %d events per batch (got %d)", maxBatch, len(raws))}
	}
	return raws, nil
}

// fromEnvelope decodes one plain JSON envelope.
func fromEnvelope(raw []byte) item {
	var it item
	err := json.Unmarshal(raw, &it.ev)
	if err == nil {
		return it
	}
	it.errs = event.FieldErrors(err)
	if len(it.errs) == 0 {
		return item{whole: true, errs: []*event.FieldError{{Field: "event", Rule: "must be a JSON envelope object (" + err.Error() + ")"}}}
	}
	// A field of the wrong JSON type leaves nothing decoded: report that
	// field alone rather than every "required" the empty event would earn.
	it.whole = reflect.ValueOf(it.ev).IsZero()
	return it
}

// ceFields maps CloudEvents attribute names to the envelope's field names,
// so an error about a CloudEvent names the field a caller of either form
// knows.
var ceFields = map[string]string{
	"id":              "eventId",
	"type":            "eventType",
	"source":          "source",
	"subject":         "aggregateId",
	"time":            "occurredAt",
	"datacontenttype": "payloadType",
}

// fromCloudEvent reads one CloudEvent, keeping the SDK's spec violations as
// field errors alongside relaybus's own.
func fromCloudEvent(ce *cloudevents.Event) item {
	var it item
	if verr := ce.Validate(); verr != nil {
		var ve cloudevents.ValidationError
		if errors.As(verr, &ve) {
			attrs := make([]string, 0, len(ve))
			for a := range ve {
				attrs = append(attrs, a)
			}
			sort.Strings(attrs)
			for _, a := range attrs {
				field := a
				if f, ok := ceFields[a]; ok {
					field = f
				}
				it.errs = append(it.errs, &event.FieldError{Field: field, Rule: "CloudEvents " + a + ": " + ve[a].Error()})
			}
		} else {
			it.errs = append(it.errs, &event.FieldError{Field: "event", Rule: "CloudEvents: " + verr.Error()})
		}
	}
	ev, err := cloudevent.ToEvent(*ce)
	it.ev = ev
	it.errs = append(it.errs, event.FieldErrors(err)...)
	if tp, ok := ce.Extensions()["traceparent"].(string); ok {
		it.traceparent = tp
	}
	return it
}

// mediaType returns the request's media type, lowercased, without parameters.
func mediaType(h http.Header) string {
	ct := h.Get("Content-Type")
	if ct == "" {
		return ""
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return strings.ToLower(strings.TrimSpace(ct))
	}
	return mt
}

// traceContext is a parsed W3C traceparent.
type traceContext struct{ traceID, spanID string }

// parseTraceparent reads a W3C traceparent ("00-<32 hex>-<16 hex>-<2 hex>",
// around spaces) with internal/traceparent's rules. An invalid or all-zero
// value is ignored, as the W3C spec asks.
func parseTraceparent(s string) (traceContext, bool) {
	sc, ok := traceparent.Parse(strings.TrimSpace(s))
	if !ok {
		return traceContext{}, false
	}
	return traceContext{traceID: sc.TraceID().String(), spanID: sc.SpanID().String()}, true
}
