// Package delivery reads a Pub/Sub message out of any HTTP request Google
// sends a Cloud Run service, so that consume, rollup and dlqreplay accept
// every delivery mode with one decoder:
//
//   - Eventarc: a CloudEvent of type google.cloud.pubsub.topic.v1.messagePublished,
//     in binary mode (ce-* headers) or structured mode, whose data is
//     {"subscription", "message": {...}}; the topic is in its source.
//   - Push (wrapped): a JSON body {"message": {...}, "subscription", "deliveryAttempt"}.
//   - Push (unwrapped, --push-no-wrapper): the body is the message data; with
//     write-metadata, attributes arrive as headers (so a binary-mode event's
//     ce-* attributes make the request a binary-mode CloudEvent) and message
//     metadata as x-goog-pubsub-* headers.
//
// functions-framework-go converts raw push bodies into CloudEvents itself but
// drops orderingKey, subscription and deliveryAttempt; relaybus functions are
// therefore registered as HTTP functions and decode with Read.
package delivery

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/shared/event"
)

// Delivery modes reported in Delivery.Mode.
const (
	ModeEventarc      = "eventarc"
	ModePush          = "push"
	ModePushUnwrapped = "push-unwrapped"
)

// MessagePublishedType is the CloudEvents type of Eventarc's Pub/Sub events.
const MessagePublishedType = "google.cloud.pubsub.topic.v1.messagePublished"

// DefaultMaxBody bounds request bodies: a 10 MB message, base64-encoded in a
// JSON wrapper, is under 14 MB.
const DefaultMaxBody = 16 << 20

// Delivery is one Pub/Sub message as an HTTP request carried it.
type Delivery struct {
	// Mode is ModeEventarc, ModePush or ModePushUnwrapped.
	Mode string
	// Subscription is the subscription's name as sent (often a full
	// projects/<p>/subscriptions/<id> path); empty when the request did not say.
	Subscription string
	// Message is the message: id, data, attributes, ordering key, publish
	// time, delivery attempt (0 when the mode does not say) and, when the
	// request reveals it, the topic.
	Message event.Message
}

// ErrMalformed wraps every failure to read a delivery. Such a request can
// never succeed; consume acknowledges it rather than answer 400, which push
// would redeliver forever.
var ErrMalformed = errors.New("malformed delivery")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// wire is the JSON shape of a Pub/Sub message in push and Eventarc bodies.
// Google sends both camelCase and snake_case spellings of some fields.
type wire struct {
	Data         []byte            `json:"data"`
	Attributes   map[string]string `json:"attributes"`
	MessageID    string            `json:"messageId"`
	MessageID2   string            `json:"message_id"`
	PublishTime  string            `json:"publishTime"`
	PublishTime2 string            `json:"publish_time"`
	OrderingKey  string            `json:"orderingKey"`
	OrderingKey2 string            `json:"ordering_key"`
}

type wrapper struct {
	Message         *wire  `json:"message"`
	Subscription    string `json:"subscription"`
	DeliveryAttempt *int   `json:"deliveryAttempt"`
}

// Read decodes r into a Delivery, reading at most maxBody bytes of body
// (DefaultMaxBody when zero). Message.Topic is filled from the request (an
// Eventarc source) or else from the subscription's name. Every error wraps
// ErrMalformed.
func Read(r *http.Request, maxBody int64) (Delivery, error) {
	d, err := read(r, maxBody)
	if err == nil && d.Message.Topic == "" {
		d.Message.Topic = d.Topic()
	}
	return d, err
}

func read(r *http.Request, maxBody int64) (Delivery, error) {
	if maxBody <= 0 {
		maxBody = DefaultMaxBody
	}
	body, err := readBody(r, maxBody)
	if err != nil {
		return Delivery{}, malformed("read body: %v", err)
	}
	if int64(len(body)) > maxBody {
		return Delivery{}, malformed("body over %d bytes", maxBody)
	}
	h := r.Header
	ct := strings.ToLower(h.Get("Content-Type"))

	// Eventarc, binary mode.
	if h.Get("Ce-Type") == MessagePublishedType {
		d, err := fromWrapper(body, ModeEventarc)
		if err != nil {
			return Delivery{}, err
		}
		d.Message.Topic = topicFromSource(h.Get("Ce-Source"))
		return d, nil
	}
	// Structured CloudEvent: Eventarc in structured mode, or one of
	// relaybus's own structured messages pushed unwrapped.
	if strings.HasPrefix(ct, event.MediaTypeCloudEventsJSON) {
		var ce struct {
			Type   string          `json:"type"`
			Source string          `json:"source"`
			Data   json.RawMessage `json:"data"`
		}
		if json.Unmarshal(body, &ce) == nil && ce.Type == MessagePublishedType {
			d, err := fromWrapper(ce.Data, ModeEventarc)
			if err != nil {
				return Delivery{}, err
			}
			d.Message.Topic = topicFromSource(ce.Source)
			return d, nil
		}
		return unwrapped(body, h), nil
	}
	// Wrapped push: the body decoded once, the common case. A body that
	// does not decode as a wrapper takes the slow path, which tells an
	// unwrapped message from a malformed wrapper.
	if w, ok := decodeWrapper(body); ok {
		if w.Message != nil {
			return fromWire(w, ModePush)
		}
		return unwrapped(body, h), nil
	}
	if looksWrapped(body) {
		return fromWrapper(body, ModePush)
	}
	return unwrapped(body, h), nil
}

// decodeWrapper decodes a body that is a JSON object, as a wrapper; ok is
// false when it is not one or does not decode as one.
func decodeWrapper(body []byte) (wrapper, bool) {
	var w wrapper
	b := bytes.TrimSpace(body)
	if len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &w) != nil {
		return wrapper{}, false
	}
	return w, true
}

// readBody reads at most maxBody+1 bytes of r's body into a buffer the
// size of its Content-Length when it says one (io.ReadAll would grow one
// from 512 bytes, copying as it goes).
func readBody(r *http.Request, maxBody int64) ([]byte, error) {
	lr := io.LimitReader(r.Body, maxBody+1)
	n := r.ContentLength
	if n <= 0 || n > maxBody {
		return io.ReadAll(lr)
	}
	buf := make([]byte, n+1) // one more: a body longer than it said is read on
	m, err := io.ReadFull(lr, buf)
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return buf[:m], nil
	case err != nil:
		return nil, err
	}
	rest, err := io.ReadAll(lr)
	return append(buf, rest...), err
}

func looksWrapped(body []byte) bool {
	b := bytes.TrimSpace(body)
	if len(b) == 0 || b[0] != '{' {
		return false
	}
	var probe struct {
		Message json.RawMessage `json:"message"`
	}
	if json.Unmarshal(b, &probe) != nil || len(probe.Message) == 0 {
		return false
	}
	return bytes.HasPrefix(bytes.TrimSpace(probe.Message), []byte("{"))
}

func fromWrapper(body []byte, mode string) (Delivery, error) {
	var w wrapper
	if err := json.Unmarshal(body, &w); err != nil {
		return Delivery{}, malformed("%s body is not {subscription, message}: %v", mode, err)
	}
	return fromWire(w, mode)
}

// fromWire reads the delivery out of a decoded wrapper.
func fromWire(w wrapper, mode string) (Delivery, error) {
	if w.Message == nil {
		return Delivery{}, malformed("%s body has no message", mode)
	}
	m := w.Message
	msg := event.Message{
		ID:          first(m.MessageID, m.MessageID2),
		Data:        m.Data,
		Attributes:  m.Attributes,
		OrderingKey: first(m.OrderingKey, m.OrderingKey2),
	}
	if msg.Attributes == nil {
		msg.Attributes = map[string]string{}
	}
	if pt := first(m.PublishTime, m.PublishTime2); pt != "" {
		t, err := time.Parse(time.RFC3339Nano, pt)
		if err != nil {
			return Delivery{}, malformed("message.publishTime %q is not RFC 3339", pt)
		}
		msg.PublishTime = t
	}
	if w.DeliveryAttempt != nil {
		msg.DeliveryAttempt = *w.DeliveryAttempt
	}
	if len(msg.Data) == 0 && len(msg.Attributes) == 0 {
		return Delivery{}, malformed("message has neither data nor attributes")
	}
	return Delivery{Mode: mode, Subscription: w.Subscription, Message: msg}, nil
}

// metadata headers of unwrapped push with write-metadata.
const goog = "x-goog-pubsub-"

// httpHeaders are request headers that are never message attributes.
var httpHeaders = map[string]bool{
	"accept": true, "accept-encoding": true, "authorization": true, "connection": true,
	"content-length": true, "forwarded": true, "from": true, "host": true, "traceparent": true,
	"transfer-encoding": true, "user-agent": true, "x-cloud-trace-context": true,
	"x-forwarded-for": true, "x-forwarded-proto": true, "x-request-id": true, "via": true,
}

func unwrapped(body []byte, h http.Header) Delivery {
	msg := event.Message{Data: body, Attributes: map[string]string{}}
	sub := ""
	for k, vs := range h {
		if len(vs) == 0 {
			continue
		}
		key, v := strings.ToLower(k), vs[0]
		if meta, ok := strings.CutPrefix(key, goog); ok {
			switch strings.ReplaceAll(meta, "_", "-") {
			case "message-id":
				msg.ID = v
			case "publish-time":
				if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
					msg.PublishTime = t
				}
			case "subscription-name", "subscription":
				sub = v
			case "ordering-key":
				msg.OrderingKey = v
			case "delivery-attempt":
				msg.DeliveryAttempt, _ = strconv.Atoi(v)
			}
			continue
		}
		if httpHeaders[key] || strings.HasPrefix(key, "x-goog-") || strings.HasPrefix(key, "x-cloud-") {
			continue
		}
		msg.Attributes[key] = v
	}
	return Delivery{Mode: ModePushUnwrapped, Subscription: sub, Message: msg}
}

// topicFromSource reads the topic id out of an Eventarc Pub/Sub source,
// //pubsub.googleapis.com/projects/<p>/topics/<t>.
func topicFromSource(src string) string {
	if i := strings.Index(src, "/topics/"); i >= 0 {
		return names.ResourceID(src[i:])
	}
	return ""
}

// Topic returns the topic the delivered message was published to: the one
// the request named (Eventarc), else the one the subscription name implies
// (<topic>.<consumer>-<role>), else "".
func (d Delivery) Topic() string {
	if d.Message.Topic != "" {
		return d.Message.Topic
	}
	if topic, _, _, err := names.ParseSubscription(d.Subscription); err == nil {
		return topic
	}
	return ""
}

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// WrappedBody returns the wrapped push body Pub/Sub would send for m on
// subscription, with deliveryAttempt when attempt > 0. The local delivery
// loop and tests use it to make the same requests Google makes.
func WrappedBody(m event.Message, subscription string, attempt int) []byte {
	b, _ := json.Marshal(map[string]any{"message": wireOf(m), "subscription": subscription, "deliveryAttempt": nilIfZero(attempt)})
	return b
}

// EventarcRequest builds the binary-mode CloudEvent request Eventarc sends
// for m, published on topic in project, to url.
func EventarcRequest(url, project, topic, subscription string, m event.Message) (*http.Request, error) {
	body, _ := json.Marshal(map[string]any{"message": wireOf(m), "subscription": subscription})
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Ce-Specversion", "1.0")
	req.Header.Set("Ce-Type", MessagePublishedType)
	req.Header.Set("Ce-Source", "//pubsub.googleapis.com/projects/"+project+"/topics/"+names.ResourceID(topic))
	req.Header.Set("Ce-Id", m.ID)
	if !m.PublishTime.IsZero() {
		req.Header.Set("Ce-Time", m.PublishTime.UTC().Format(time.RFC3339Nano))
	}
	return req, nil
}

// UnwrappedRequest builds the request an unwrapped push subscription with
// write-metadata sends for m.
func UnwrappedRequest(url, subscription string, m event.Message, attempt int) (*http.Request, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(m.Data))
	if err != nil {
		return nil, err
	}
	for k, v := range m.Attributes {
		req.Header.Set(k, v)
	}
	req.Header.Set(goog+"message-id", m.ID)
	req.Header.Set(goog+"subscription-name", subscription)
	if !m.PublishTime.IsZero() {
		req.Header.Set(goog+"publish-time", m.PublishTime.UTC().Format(time.RFC3339Nano))
	}
	if m.OrderingKey != "" {
		req.Header.Set(goog+"ordering-key", m.OrderingKey)
	}
	if attempt > 0 {
		req.Header.Set(goog+"delivery-attempt", strconv.Itoa(attempt))
	}
	return req, nil
}

func wireOf(m event.Message) map[string]any {
	w := map[string]any{
		"data":        base64.StdEncoding.EncodeToString(m.Data),
		"attributes":  m.Attributes,
		"messageId":   m.ID,
		"message_id":  m.ID,
		"orderingKey": m.OrderingKey,
	}
	if !m.PublishTime.IsZero() {
		pt := m.PublishTime.UTC().Format(time.RFC3339Nano)
		w["publishTime"], w["publish_time"] = pt, pt
	}
	return w
}

func nilIfZero(n int) any {
	if n == 0 {
		return nil
	}
	return n
}
