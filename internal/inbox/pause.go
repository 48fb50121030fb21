package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/postgres"
)

// A consumer's own delivery control (migration 005): an operator's pause
// of a consumer on a topic is a row in relaybus_inbox_pause, in the
// consumer's database. consume reads it (PauseFlags): while it stands a
// pull worker stops pulling and answers what it holds with a hold (no
// attempt), and an HTTP delivery is kept (Hold) and acknowledged, so no
// delivery attempt is spent and nothing is dead-lettered however long the
// pause lasts. Resuming deletes the row and publishes the kept deliveries
// again (PublishHeld). It is how relaybus pauses the consumers whose
// broker has no pause of its own: pull workers, Eventarc triggers, NATS.
//
// A forward consumer's circuit breaker pauses an Eventarc consumer the same
// way (migration 009, PauseFlagByBreaker): the row is then marked as the
// breaker's, and consume's probe lifts only such a row. An operator's pause
// takes a breaker's row over (SetPaused), and an operator's resume lifts
// either.

var (
	pauseSetSQL    = query("pauseset")
	pauseClearSQL  = query("pauseclear")
	pausedSQL      = query("pausedtopics")
	pauseStateSQL  = query("pausestate")
	holdSQL        = query("hold")
	heldTakeSQL    = query("heldtake")
	heldDoneSQL    = query("helddone")
	forgetSQL      = query("forgetpauses")
	heldBatch      = 100
	heldAttrPaused = "relaybus_held"
)

// SetPaused pauses (paused) or resumes consumerID on topic and reports
// whether that changed anything. An operator's pause over a circuit
// breaker's takes it over (the probe then leaves it); a resume lifts any.
func SetPaused(ctx context.Context, db postgres.DBTX, consumerID, topic string, paused bool, by string) (bool, error) {
	q, args := pauseClearSQL, []any{consumerID, topic}
	if paused {
		q, args = pauseSetSQL, append(args, by)
	}
	tag, err := db.Exec(ctx, q, args...)
	if err != nil {
		return false, fmt.Errorf("inbox: pause state of %s on %s: %w", consumerID, topic, err)
	}
	return tag.RowsAffected() > 0, nil
}

// ForgetPauses deletes the pause state of a consumer that is removed
// (a forwarder): its flag on topic, the deliveries that flag kept, and the
// push pause record of its subscription. A consumer added again under the
// same name starts unpaused; what a pause kept for the removed one is
// dropped with its backlog.
func ForgetPauses(ctx context.Context, db postgres.DBTX, consumerID, topic, subscription string) error {
	if _, err := db.Exec(ctx, forgetSQL, consumerID, topic, subscription); err != nil {
		return fmt.Errorf("inbox: forget the pauses of %s on %s: %w", consumerID, topic, err)
	}
	return nil
}

// PauseState is a consumer's pause on a topic: whether it stands, and how
// many HTTP deliveries are kept until it is lifted.
type PauseState struct {
	Paused bool
	Held   int64
	// ByBreaker: the pause is a forward consumer's circuit breaker's
	// (PauseFlagByBreaker), not an operator's.
	ByBreaker bool
}

// PausedState reads consumerID's pause on topic.
func PausedState(ctx context.Context, db postgres.DBTX, consumerID, topic string) (PauseState, error) {
	var s PauseState
	if err := db.QueryRow(ctx, pauseStateSQL, consumerID, topic).Scan(&s.Paused, &s.Held, &s.ByBreaker); err != nil {
		return s, fmt.Errorf("inbox: pause state of %s on %s: %w", consumerID, topic, err)
	}
	return s, nil
}

// heldMessage is a kept delivery as stored.
type heldMessage struct {
	ID          string            `json:"id"`
	Data        []byte            `json:"data"`
	Attributes  map[string]string `json:"attributes,omitempty"`
	OrderingKey string            `json:"orderingKey,omitempty"`
	PublishTime time.Time         `json:"publishTime"`
}

// Hold keeps m, a delivery to consumerID from topic, while the consumer is
// paused there, and reports whether it did: false means the pause is gone
// and the delivery is to be handled now.
func Hold(ctx context.Context, db postgres.DBTX, consumerID, topic string, m event.Message) (bool, error) {
	b, err := json.Marshal(heldMessage{ID: m.ID, Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey, PublishTime: m.PublishTime})
	if err != nil {
		return false, fmt.Errorf("inbox: hold: %w", err)
	}
	// As text: through PgBouncer (simple protocol, no parameter types) a
	// []byte goes as bytea, which jsonb refuses.
	tag, err := db.Exec(ctx, holdSQL, consumerID, topic, string(b))
	if err != nil {
		return false, fmt.Errorf("inbox: hold a delivery to %s from %s: %w", consumerID, topic, err)
	}
	return tag.RowsAffected() > 0, nil
}

// PublishHeld publishes again, to topic, every delivery kept for
// consumerID while it was paused there, oldest first, each addressed to
// consumerID alone (target attr set to it: every other consumer ignores
// it), deleting each once published. It returns how many it published;
// on an error the rest stay kept, and a second call goes on with them.
func PublishHeld(ctx context.Context, db postgres.DBTX, pub event.Publisher, consumerID, topic, targetAttr string) (int, error) {
	n := 0
	for {
		rows, err := db.Query(ctx, heldTakeSQL, consumerID, topic, heldBatch)
		if err != nil {
			return n, fmt.Errorf("inbox: kept deliveries of %s from %s: %w", consumerID, topic, err)
		}
		type kept struct {
			seq int64
			m   heldMessage
		}
		var batch []kept
		for rows.Next() {
			var k kept
			var b []byte
			if err := rows.Scan(&k.seq, &b); err != nil {
				rows.Close()
				return n, fmt.Errorf("inbox: kept deliveries of %s from %s: %w", consumerID, topic, err)
			}
			if err := json.Unmarshal(b, &k.m); err != nil {
				rows.Close()
				return n, fmt.Errorf("inbox: kept delivery %d of %s: %w", k.seq, consumerID, err)
			}
			batch = append(batch, k)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return n, fmt.Errorf("inbox: kept deliveries of %s from %s: %w", consumerID, topic, err)
		}
		if len(batch) == 0 {
			return n, nil
		}
		for _, k := range batch {
			attrs := make(map[string]string, len(k.m.Attributes)+2)
			for a, v := range k.m.Attributes {
				attrs[a] = v
			}
			attrs[targetAttr] = consumerID
			attrs[heldAttrPaused] = k.m.ID
			if _, err := pub.Publish(ctx, topic, event.Message{Data: k.m.Data, Attributes: attrs, OrderingKey: k.m.OrderingKey}); err != nil {
				return n, fmt.Errorf("inbox: publish kept delivery %d of %s to %s: %w", k.seq, consumerID, topic, err)
			}
			if _, err := db.Exec(ctx, heldDoneSQL, consumerID, topic, k.seq); err != nil {
				return n, fmt.Errorf("inbox: kept delivery %d of %s: %w", k.seq, consumerID, err)
			}
			n++
		}
	}
}

// PauseFlags is consume's view of its consumer's pauses: the topics it is
// paused on, read from the database at most once per Every (so a pause
// takes effect within Every; the reads cost one statement per Every per
// process, none per delivery).
type PauseFlags struct {
	DB         postgres.DBTX
	ConsumerID string
	// Every is how stale the view may be (DefaultPauseEvery when 0).
	Every time.Duration

	mu     sync.Mutex
	read   time.Time
	topics map[string]bool
	err    error
}

// DefaultPauseEvery is PauseFlags.Every's default: how long a pause may
// take to reach consume.
const DefaultPauseEvery = time.Second

// Set changes this process's view of the consumer's pause on topic at
// once, until the next read (consume sets it when its breaker pauses or
// resumes the consumer, so that its own deliveries follow without waiting
// for Every).
func (f *PauseFlags) Set(topic string, paused bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.topics == nil {
		f.topics = map[string]bool{}
	}
	if paused {
		f.topics[topic] = true
	} else {
		delete(f.topics, topic)
	}
}

// Paused reports whether the consumer is paused on topic. A failed read keeps the last view (none: not paused) and
// returns the error.
func (f *PauseFlags) Paused(ctx context.Context, topic string) (bool, error) {
	every := f.Every
	if every <= 0 {
		every = DefaultPauseEvery
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(f.read) >= every {
		f.read = time.Now()
		f.err = f.load(ctx)
	}
	return f.topics[topic], f.err
}

func (f *PauseFlags) load(ctx context.Context) error {
	rows, err := f.DB.Query(ctx, pausedSQL, f.ConsumerID)
	if err != nil {
		return fmt.Errorf("inbox: pauses of %s: %w", f.ConsumerID, err)
	}
	defer rows.Close()
	topics := map[string]bool{}
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return fmt.Errorf("inbox: pauses of %s: %w", f.ConsumerID, err)
		}
		topics[t] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("inbox: pauses of %s: %w", f.ConsumerID, err)
	}
	f.topics = topics
	return nil
}
