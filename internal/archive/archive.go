// Package archive keeps dead letters in Firestore (collection dead_letters)
// so an operator can list, inspect, replay and delete them: one document per
// dead-lettered message (its id on the dead-letter topic), with the original
// data, attributes and ordering key, where and why it failed (deadletter.Read:
// consume's poison attributes or Pub/Sub's own), and what operators did with
// it. Archiving is idempotent on the message id; a deleted letter stays as a
// tombstone saying who deleted it and when.
//
// Listing reads the collection newest first (archivedAt, a single-field
// index) and filters in memory: dead letters are few, and no composite index
// is needed.
//
// Every letter carries deleteAt (archived time + the store's retention,
// DefaultRetention unless ARCHIVE_RETENTION says otherwise): a Firestore TTL
// policy on that field (Terraform's) deletes letters, tombstones included,
// once they are older than the retention. The field is exempt from indexing
// (infra/firestore/indexes.yaml), as a timestamp no query uses.
//
// A letter Pub/Sub dead-lettered names the subscription it failed on, and
// for an Eventarc consumer that is the trigger's own
// eventarc-<region>-<trigger>-sub-<n>: given the topology's
// SubscriptionMap (WithSubscriptions), the store records the consumer and
// its logical subscription, and keeps the real one in pubsubSubscription.
package archive

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/iterator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/relaybus/relaybus/internal/cloudevent"
	"github.com/relaybus/relaybus/internal/deadletter"
	"github.com/relaybus/relaybus/internal/names"
	"github.com/relaybus/relaybus/internal/privacy"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/topology"
)

// Letter is one archived dead letter.
type Letter struct {
	// ID is the message's id on the dead-letter topic.
	ID string `firestore:"id" json:"id"`
	// Topic is the original topic; DeadLetterTopic where it was archived from.
	Topic           string `firestore:"topic" json:"topic"`
	DeadLetterTopic string `firestore:"deadLetterTopic" json:"deadLetterTopic"`
	// Subscription and Consumer say who failed it: the consumer's logical
	// subscription (<topic>.<service>-<role>) when it is known.
	Subscription string `firestore:"subscription" json:"subscription"`
	Consumer     string `firestore:"consumer" json:"consumer"`
	// PubSubSubscription is the subscription Pub/Sub named, when it is not
	// the logical one (an Eventarc trigger's eventarc-…-sub-<n>).
	PubSubSubscription string `firestore:"pubsubSubscription,omitempty" json:"pubsubSubscription,omitempty"`
	// Reason is a poison reason or deadletter.ReasonMaxDeliveryAttempts.
	Reason string `firestore:"reason" json:"reason"`
	Error  string `firestore:"error,omitempty" json:"error,omitempty"`
	// Deliveries is Pub/Sub's delivery count (0 for poison).
	Deliveries int `firestore:"deliveries" json:"deliveries"`
	// The event, as far as the attributes tell.
	EventID     string `firestore:"eventId,omitempty" json:"eventId,omitempty"`
	EventType   string `firestore:"eventType,omitempty" json:"eventType,omitempty"`
	AggregateID string `firestore:"aggregateId,omitempty" json:"aggregateId,omitempty"`
	// The original message.
	Data        []byte            `firestore:"data" json:"data"`
	Attributes  map[string]string `firestore:"attributes" json:"attributes"`
	OrderingKey string            `firestore:"orderingKey,omitempty" json:"orderingKey,omitempty"`
	// DeadLetteredAt and ArchivedAt say when.
	DeadLetteredAt time.Time `firestore:"deadLetteredAt" json:"deadLetteredAt"`
	ArchivedAt     time.Time `firestore:"archivedAt" json:"archivedAt"`
	// DeleteAt is when the TTL policy deletes the letter: ArchivedAt plus
	// the store's retention.
	DeleteAt time.Time `firestore:"deleteAt" json:"deleteAt"`
	// Replays are the operators' replays, oldest first.
	Replays []Replay `firestore:"replays" json:"replays"`
	// Deleted marks a tombstone.
	Deleted   bool      `firestore:"deleted" json:"deleted"`
	DeletedBy string    `firestore:"deletedBy,omitempty" json:"deletedBy,omitempty"`
	DeletedAt time.Time `firestore:"deletedAt,omitempty" json:"deletedAt,omitempty"`
	// Erased marks a tombstone left by an erasure by subject
	// (EraseSubject): its data and error text are gone.
	Erased bool `firestore:"erased,omitempty" json:"erased,omitempty"`
	// RedactedFields are the JSON pointers of the personal fields the
	// topic's privacy rule (archive: redact) hashed or removed from Data
	// when the letter was archived; PayloadWithheld is true when the rule
	// kept none of the payload (archive: drop, or redact of a payload that
	// is not JSON), and Data is empty. Either way the letter is not the
	// event as produced, and is not replayed (PayloadKept).
	RedactedFields  []string `firestore:"redactedFields,omitempty" json:"redactedFields,omitempty"`
	PayloadWithheld bool     `firestore:"payloadWithheld,omitempty" json:"payloadWithheld,omitempty"`
}

// PayloadKept reports whether the letter holds the message's payload as it
// was produced: not erased, redacted or withheld.
func (l *Letter) PayloadKept() bool {
	return !l.Erased && !l.PayloadWithheld && len(l.RedactedFields) == 0
}

// Replay is one operator's replay of a letter.
type Replay struct {
	By        string    `firestore:"by" json:"by"`
	At        time.Time `firestore:"at" json:"at"`
	MessageID string    `firestore:"messageId" json:"messageId"`
	Consumer  string    `firestore:"consumer" json:"consumer"`
}

// Original returns the message as it was on its topic, without the
// dead-letter attributes.
func (l *Letter) Original() event.Message {
	m := deadletter.Original(event.Message{Data: l.Data, Attributes: l.Attributes, OrderingKey: l.OrderingKey})
	m.Topic = l.Topic
	return m
}

// Store is the archive.
type Store struct {
	col       *firestore.CollectionRef
	now       func() time.Time
	retention time.Duration
	subs      *topology.SubscriptionMap
	rules     privacy.Rules
	key       privacy.Key
}

// DefaultRetention is how long a letter is kept when no retention is given
// (ARCHIVE_RETENTION's default, 30 days).
const DefaultRetention = 720 * time.Hour

// Option tunes a Store.
type Option func(*Store)

// WithRetention sets how long letters are kept (their deleteAt); zero or
// less keeps DefaultRetention.
func WithRetention(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.retention = d
		}
	}
}

// WithSubscriptions resolves the subscriptions Pub/Sub names on dead
// letters to their consumers (see the package documentation).
func WithSubscriptions(m *topology.SubscriptionMap) Option {
	return func(s *Store) { s.subs = m }
}

// WithPrivacy applies the topics' privacy rules to the letters archived:
// a topic whose rule sets archive to redact keeps its letters' payloads
// with the personal fields hashed under key (or removed), one set to drop
// keeps no payload (docs/privacy.md). Without it every letter is kept whole.
func WithPrivacy(rules privacy.Rules, key privacy.Key) Option {
	return func(s *Store) { s.rules, s.key = rules, key }
}

// WithClock sets the store's clock (tests).
func WithClock(now func() time.Time) Option {
	return func(s *Store) { s.now = func() time.Time { return now().UTC() } }
}

// New returns the archive in c's database.
func New(c *firestore.Client, opts ...Option) *Store {
	s := &Store{col: c.Collection(model.CollectionDeadLetters), now: func() time.Time { return time.Now().UTC() }, retention: DefaultRetention}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Retention returns how long the store keeps letters.
func (s *Store) Retention() time.Duration { return s.retention }

// resolve fills a letter's consumer and logical subscription from the
// subscription Pub/Sub named.
func (s *Store) resolve(l *Letter) {
	if l.Subscription == "" {
		return
	}
	if c, ok := s.subs.Consumer(l.Subscription); ok {
		if logical := c.Subscription(); logical != l.Subscription {
			if l.PubSubSubscription == "" {
				l.PubSubSubscription = l.Subscription
			}
			l.Subscription = logical
		}
		if l.Consumer == "" {
			l.Consumer = c.Service
		}
		return
	}
	if l.Consumer == "" {
		if _, consumer, _, err := names.ParseSubscription(l.Subscription); err == nil {
			l.Consumer = consumer
		}
	}
}

// ErrNotFound means no letter has that id.
var ErrNotFound = errors.New("dead letter not found")

// ErrBadPageToken means a page token names no letter (it was not a
// nextPageToken, or its letter expired since).
var ErrBadPageToken = errors.New("not a nextPageToken of this listing")

// docID keeps ids valid as document ids (no slashes).
func docID(id string) string {
	if id == "" || strings.ContainsAny(id, "/") || id == "." || id == ".." || strings.HasPrefix(id, "__") {
		return "b64_" + base64.RawURLEncoding.EncodeToString([]byte(id))
	}
	return id
}

// Archive stores m, a message of dlqTopic. A message archived before is
// returned as it is, with created false.
func (s *Store) Archive(ctx context.Context, dlqTopic string, m event.Message) (Letter, bool, error) {
	if m.ID == "" {
		return Letter{}, false, errors.New("archive: the dead letter has no message id")
	}
	info := deadletter.Read(m)
	l := Letter{
		ID: m.ID, DeadLetterTopic: dlqTopic, Topic: strings.TrimSuffix(dlqTopic, names.DeadLetterSuffix),
		Subscription: info.Subscription, Consumer: info.Consumer, Reason: info.Reason, Error: info.Error,
		Deliveries: info.Deliveries, EventID: m.Attributes[event.AttrEventID], EventType: m.Attributes[event.AttrEventType],
		AggregateID: m.Attributes[event.AttrAggregateID], Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey,
		DeadLetteredAt: info.DeadLetteredAt, ArchivedAt: s.now(), Replays: []Replay{},
	}
	l.DeleteAt = l.ArchivedAt.Add(s.retention)
	if err := s.applyPrivacy(&l); err != nil {
		return Letter{}, false, fmt.Errorf("archive %s: %w", m.ID, err)
	}
	s.resolve(&l)
	if l.DeadLetteredAt.IsZero() {
		l.DeadLetteredAt = m.PublishTime.UTC()
	}
	if l.Attributes == nil {
		l.Attributes = map[string]string{}
	}
	_, err := s.col.Doc(docID(m.ID)).Create(ctx, l)
	if status.Code(err) == codes.AlreadyExists {
		old, err := s.Get(ctx, m.ID)
		return old, false, err
	}
	if err != nil {
		return Letter{}, false, fmt.Errorf("archive %s: %w", m.ID, err)
	}
	return l, true, nil
}

// Get returns one letter (tombstones too).
func (s *Store) Get(ctx context.Context, id string) (Letter, error) {
	snap, err := s.col.Doc(docID(id)).Get(ctx)
	if status.Code(err) == codes.NotFound {
		return Letter{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return Letter{}, fmt.Errorf("archive: get %s: %w", id, err)
	}
	var l Letter
	if err := snap.DataTo(&l); err != nil {
		return Letter{}, fmt.Errorf("archive: decode %s: %w", id, err)
	}
	s.resolve(&l) // letters archived before the map named their subscription
	return l, nil
}

// Filter selects letters; empty fields match everything.
type Filter struct {
	Topic, Consumer, Reason string
	// EventID selects the letters of one event.
	EventID string
	// Unreplayed selects letters no operator replayed yet.
	Unreplayed bool
	// Since and Until bound archivedAt.
	Since, Until time.Time
	// Deleted includes tombstones.
	Deleted bool
}

func (f Filter) match(l *Letter) bool {
	return (f.Topic == "" || l.Topic == f.Topic) && (f.Consumer == "" || l.Consumer == f.Consumer) && (f.EventID == "" || l.EventID == f.EventID) && (!f.Unreplayed || len(l.Replays) == 0) &&
		(f.Reason == "" || l.Reason == f.Reason) && (f.Deleted || !l.Deleted) &&
		(f.Since.IsZero() || !l.ArchivedAt.Before(f.Since)) && (f.Until.IsZero() || l.ArchivedAt.Before(f.Until))
}

// List returns up to size letters matching f, newest first, after the
// letter whose id is after ("" from the start), and the id to continue
// after ("" at the end).
func (s *Store) List(ctx context.Context, f Filter, size int, after string) ([]Letter, string, error) {
	if size <= 0 || size > 500 {
		size = 50
	}
	q := s.col.OrderBy("archivedAt", firestore.Desc).OrderBy(firestore.DocumentID, firestore.Desc)
	if after != "" {
		snap, err := s.col.Doc(docID(after)).Get(ctx)
		if status.Code(err) == codes.NotFound {
			return nil, "", fmt.Errorf("archive: page token %q: %w", after, ErrBadPageToken)
		}
		if err != nil {
			return nil, "", fmt.Errorf("archive: page token %q: %w", after, err)
		}
		q = q.StartAfter(snap)
	}
	it := q.Documents(ctx)
	defer it.Stop()
	var out []Letter
	for {
		snap, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, "", nil
		}
		if err != nil {
			return nil, "", fmt.Errorf("archive: list: %w", err)
		}
		var l Letter
		if err := snap.DataTo(&l); err != nil {
			return nil, "", fmt.Errorf("archive: decode %s: %w", snap.Ref.ID, err)
		}
		s.resolve(&l)
		if !f.match(&l) {
			continue
		}
		if len(out) == size {
			return out, out[len(out)-1].ID, nil
		}
		out = append(out, l)
	}
}

// AddReplay records a replay.
func (s *Store) AddReplay(ctx context.Context, id string, r Replay) error {
	_, err := s.col.Doc(docID(id)).Update(ctx, []firestore.Update{{Path: "replays", Value: firestore.ArrayUnion(r)}})
	if err != nil {
		return fmt.Errorf("archive: record replay of %s: %w", id, err)
	}
	return nil
}

// Delete turns a letter into a tombstone saying who deleted it.
func (s *Store) Delete(ctx context.Context, id, by string) (Letter, error) {
	l, err := s.Get(ctx, id)
	if err != nil {
		return Letter{}, err
	}
	if l.Deleted {
		return l, nil
	}
	l.Deleted, l.DeletedBy, l.DeletedAt = true, by, s.now()
	if _, err := s.col.Doc(docID(id)).Update(ctx, []firestore.Update{
		{Path: "deleted", Value: true}, {Path: "deletedBy", Value: by}, {Path: "deletedAt", Value: l.DeletedAt},
	}); err != nil {
		return Letter{}, fmt.Errorf("archive: delete %s: %w", id, err)
	}
	return l, nil
}

// MaxSummaryScan bounds how many letters Summarize reads.
const MaxSummaryScan = 20000

// Summary counts the letters a filter matches.
type Summary struct {
	// Total is how many letters match.
	Total int `json:"total"`
	// ByTopicConsumer splits Total by topic and consumer (an empty consumer
	// when the letter does not say), largest first.
	ByTopicConsumer []TopicConsumerCount `json:"byTopicConsumer"`
	// Truncated is true when the collection holds more than MaxSummaryScan
	// letters: the counts are of the newest MaxSummaryScan.
	Truncated bool `json:"truncated,omitempty"`
}

// TopicConsumerCount is the number of letters of one consumer on one topic.
type TopicConsumerCount struct {
	Topic    string `json:"topic"`
	Consumer string `json:"consumer"`
	Count    int    `json:"count"`
}

// summaryFields are what Summarize reads of each letter.
var summaryFields = []string{"id", "topic", "consumer", "subscription", "pubsubSubscription", "reason", "eventId", "archivedAt", "deleted", "replays"}

// Summarize counts the letters matching f (tombstones only when f.Deleted),
// by topic and consumer, reading only the fields it needs.
func (s *Store) Summarize(ctx context.Context, f Filter) (Summary, error) {
	q := s.col.OrderBy("archivedAt", firestore.Desc).Select(summaryFields...).Limit(MaxSummaryScan + 1)
	it := q.Documents(ctx)
	defer it.Stop()
	counts := map[[2]string]int{}
	var sum Summary
	read := 0
	for {
		snap, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return Summary{}, fmt.Errorf("archive: summarize: %w", err)
		}
		if read++; read > MaxSummaryScan {
			sum.Truncated = true
			break
		}
		var l Letter
		if err := snap.DataTo(&l); err != nil {
			return Summary{}, fmt.Errorf("archive: decode %s: %w", snap.Ref.ID, err)
		}
		s.resolve(&l)
		if !f.match(&l) {
			continue
		}
		sum.Total++
		counts[[2]string{l.Topic, l.Consumer}]++
	}
	sum.ByTopicConsumer = []TopicConsumerCount{}
	for k, n := range counts {
		sum.ByTopicConsumer = append(sum.ByTopicConsumer, TopicConsumerCount{Topic: k[0], Consumer: k[1], Count: n})
	}
	sort.Slice(sum.ByTopicConsumer, func(i, j int) bool {
		a, b := sum.ByTopicConsumer[i], sum.ByTopicConsumer[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		return a.Consumer < b.Consumer
	})
	return sum, nil
}

// applyPrivacy keeps of l's payload what its topic's rule lets the archive
// keep. The event is decoded, its payload redacted, and the message's data
// encoded again in the shape it came in (structured JSON or protobuf, or
// binary); a message that does not decode (poison) or came in another shape
// keeps no payload under redact.
func (s *Store) applyPrivacy(l *Letter) error {
	r := s.rules.Of(l.Topic)
	if r.Mode(privacy.Archive) == privacy.Whole || len(l.Data) == 0 {
		return nil
	}
	withhold := func() { l.Data, l.PayloadWithheld = []byte{}, true }
	e, enc, ok := decodeLetter(l)
	if !ok { // poison, or a shape with no fields to pick out
		withhold()
		return nil
	}
	res, err := r.Apply(privacy.Archive, e.Payload, s.key)
	if err != nil {
		return err
	}
	if res.Dropped {
		withhold()
		return nil
	}
	if len(res.Redacted) == 0 {
		return nil
	}
	e.Payload = res.Payload
	if m, err := cloudevent.EncodeLarge(&e, enc); err == nil {
		l.Data, l.RedactedFields = m.Data, res.Redacted
	} else { // a payload that cannot be encoded again is not kept
		withhold()
	}
	return nil
}

// decodeLetter decodes the event of a letter and the encoding its message
// came in; false when it does not decode or came in no encoding relaybus
// writes.
func decodeLetter(l *Letter) (event.Event, event.Encoding, bool) {
	e, d, err := cloudevent.Decode(l.Original(), event.Limits{MaxPayloadBytes: event.MaxPayloadLimit})
	enc, ok := encodings[d.Mode]
	return e, enc, err == nil && ok
}

// encodings are the shapes a redacted letter is encoded again in, by the
// mode the decoder read it in.
var encodings = map[string]event.Encoding{
	event.ModeStructuredJSON:     event.EncodingJSON,
	event.ModeStructuredProtobuf: event.EncodingProtobuf,
	event.ModeBinary:             event.EncodingBinary,
}
