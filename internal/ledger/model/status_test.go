package model

import (
	"testing"
	"time"

	"github.com/relaybus/relaybus/shared/event"
)

func TestDeriveTruthTable(t *testing.T) {
	now := time.Date(2024, 2, 28, 10, 0, 0, 0, time.UTC)
	ok := func(c string, n int) Attempt {
		return Attempt{ConsumerID: c, AttemptNo: n, Success: true, Outcome: OutcomeSuccess}
	}
	fail := func(c string, n int, o Outcome) Attempt {
		return Attempt{ConsumerID: c, AttemptNo: n, Outcome: o}
	}
	latest := func(as ...Attempt) map[string]Attempt { return LatestByConsumer(as) }
	two := []string{"member-service", "message-service"}
	repush := func(consumer string, since ...ConsumerMark) *Repush {
		return &Repush{At: now, Consumer: consumer, Since: since}
	}
	mark := func(c string, n int) ConsumerMark { return ConsumerMark{ConsumerID: c, AttemptNo: n} }

	cases := []struct {
		name string
		f    Facts
		want Status
	}{
		// 1. CONSUMED
		{"one consumer succeeded", Facts{Expected: []string{"a"}, Latest: latest(ok("a", 1)), Sent: true}, StatusConsumed},
		{"both consumers succeeded", Facts{Expected: two, Latest: latest(ok("member-service", 1), ok("message-service", 1)), Sent: true}, StatusConsumed},
		{"latest attempt wins: failed then succeeded", Facts{Expected: two, Latest: latest(ok("member-service", 1), fail("message-service", 1, OutcomeRetry), ok("message-service", 2)), Sent: true}, StatusConsumed},
		{"consumed beats expiry", Facts{Expected: []string{"a"}, Latest: latest(ok("a", 1)), Sent: true, ExpireAt: now.Add(-time.Hour)}, StatusConsumed},
		{"consumed although the send was never recorded (ledger behind)", Facts{Expected: []string{"a"}, Latest: latest(ok("a", 1))}, StatusConsumed},
		{"consumed beats an outstanding re-push to a consumer that succeeded since", Facts{Expected: []string{"a"}, Latest: latest(ok("a", 3)), Sent: true, Repush: repush("", mark("a", 2))}, StatusConsumed},

		// 2. EXPIRED
		{"expired while waiting", Facts{Expected: two, Sent: true, ExpireAt: now}, StatusExpired},
		{"expired while partial", Facts{Expected: two, Latest: latest(ok("member-service", 1), fail("message-service", 1, OutcomeFailed)), Sent: true, ExpireAt: now.Add(-time.Second)}, StatusExpired},
		{"expired before it was ever published", Facts{Expected: two, ExpireAt: now.Add(-time.Second)}, StatusExpired},
		{"expireAt in the future changes nothing", Facts{Expected: two, Sent: true, ExpireAt: now.Add(time.Second)}, StatusSent},

		// 3. Outbox side
		{"never published, relay retrying", Facts{Expected: two, PublishFailure: &PublishFailure{Attempts: 2}}, StatusPending},
		{"never published, relay gave up", Facts{Expected: two, PublishFailure: &PublishFailure{Attempts: 5, Final: true}}, StatusFailed},
		{"never published and not recorded anywhere yet", Facts{Expected: two}, StatusPending},
		{"unrecorded send but a consumer reported (publish was ambiguous)", Facts{Expected: two, Latest: latest(ok("member-service", 1)), PublishFailure: &PublishFailure{Attempts: 1}}, StatusSent},

		// 4. RETRYING after a re-push
		{"re-push of a failed event to everyone", Facts{Expected: two, Latest: latest(ok("member-service", 1), fail("message-service", 1, OutcomeFailed)), Sent: true, Repush: repush("", mark("member-service", 1), mark("message-service", 1))}, StatusRetrying},
		{"re-push to one consumer that failed", Facts{Expected: two, Latest: latest(ok("member-service", 1), fail("message-service", 2, OutcomeFailed)), Sent: true, Repush: repush("message-service", mark("message-service", 2))}, StatusRetrying},
		{"re-push to a consumer that never reported", Facts{Expected: two, Latest: latest(ok("member-service", 1)), Sent: true, Repush: repush("message-service", mark("message-service", 0))}, StatusRetrying},
		{"re-push answered by a new failure", Facts{Expected: two, Latest: latest(ok("member-service", 1), fail("message-service", 3, OutcomeFailed)), Sent: true, Repush: repush("message-service", mark("message-service", 2))}, StatusPartial},
		{"re-push answered by success", Facts{Expected: two, Latest: latest(ok("member-service", 1), ok("message-service", 3)), Sent: true, Repush: repush("message-service", mark("message-service", 2))}, StatusConsumed},
		{"re-push whose publish was given up", Facts{Expected: two, Latest: latest(ok("member-service", 1), fail("message-service", 2, OutcomeFailed)), Sent: true, Repush: &Repush{Consumer: "message-service", Since: []ConsumerMark{mark("message-service", 2)}, PublishFailed: true}}, StatusPartial},
		{"re-push addressed only to a consumer that is not expected", Facts{Expected: []string{"a"}, Latest: latest(fail("a", 1, OutcomeFailed)), Sent: true, Repush: repush("b", mark("b", 0))}, StatusFailed},
		{"expiry beats a re-push", Facts{Expected: two, Sent: true, ExpireAt: now.Add(-time.Second), Repush: repush("", mark("member-service", 0), mark("message-service", 0))}, StatusExpired},

		// 5. Failures
		{"one succeeded, one failed for good", Facts{Expected: two, Latest: latest(ok("member-service", 1), fail("message-service", 1, OutcomeFailed)), Sent: true}, StatusPartial},
		{"one succeeded, one will be retried", Facts{Expected: two, Latest: latest(ok("member-service", 1), fail("message-service", 1, OutcomeRetry)), Sent: true}, StatusPartial},
		{"one succeeded, one poison", Facts{Expected: two, Latest: latest(ok("member-service", 1), fail("message-service", 1, OutcomePoison)), Sent: true}, StatusPartial},
		{"one succeeded, one dead-lettered", Facts{Expected: two, Latest: latest(ok("member-service", 1), fail("message-service", 5, OutcomeDeadLettered)), Sent: true}, StatusPartial},
		{"a succeeded, b failed, c waiting", Facts{Expected: []string{"a", "b", "c"}, Latest: latest(ok("a", 1), fail("b", 1, OutcomeFailed)), Sent: true}, StatusPartial},
		{"the only consumer will be retried", Facts{Expected: []string{"a"}, Latest: latest(fail("a", 1, OutcomeRetry)), Sent: true}, StatusRetrying},
		{"one retrying, one failed for good, none succeeded", Facts{Expected: two, Latest: latest(fail("member-service", 2, OutcomeRetry), fail("message-service", 1, OutcomeFailed)), Sent: true}, StatusRetrying},
		{"the only consumer failed for good", Facts{Expected: []string{"a"}, Latest: latest(fail("a", 1, OutcomeFailed)), Sent: true}, StatusFailed},
		{"every consumer failed for good", Facts{Expected: two, Latest: latest(fail("member-service", 1, OutcomePoison), fail("message-service", 4, OutcomeDeadLettered)), Sent: true}, StatusFailed},
		{"succeeded then a later replay failed", Facts{Expected: []string{"a"}, Latest: latest(ok("a", 1), fail("a", 2, OutcomeFailed)), Sent: true}, StatusFailed},

		// Strict consumers' resequencer: parked is neither a success nor a failure; stalled is a failure nothing retries.
		{"the only consumer parked the event", Facts{Expected: []string{"a"}, Latest: latest(fail("a", 1, OutcomeParked)), Sent: true}, StatusSent},
		{"parked although the send was never recorded (ledger behind)", Facts{Expected: []string{"a"}, Latest: latest(fail("a", 1, OutcomeParked))}, StatusSent},
		{"one succeeded, one parked", Facts{Expected: two, Latest: latest(ok("member-service", 1), fail("message-service", 1, OutcomeParked)), Sent: true}, StatusSent},
		{"one parked, one failed for good", Facts{Expected: two, Latest: latest(fail("member-service", 1, OutcomeParked), fail("message-service", 1, OutcomeFailed)), Sent: true}, StatusFailed},
		{"one parked, one retrying", Facts{Expected: two, Latest: latest(fail("member-service", 1, OutcomeParked), fail("message-service", 1, OutcomeRetry)), Sent: true}, StatusRetrying},
		{"parked, then applied when its predecessor came", Facts{Expected: []string{"a"}, Latest: latest(fail("a", 1, OutcomeParked), ok("a", 2)), Sent: true}, StatusConsumed},
		{"the only consumer's gap stalled", Facts{Expected: []string{"a"}, Latest: latest(fail("a", 1, OutcomeParked), fail("a", 2, OutcomeStalled)), Sent: true}, StatusFailed},
		{"one succeeded, one stalled", Facts{Expected: two, Latest: latest(ok("member-service", 1), fail("message-service", 2, OutcomeStalled)), Sent: true}, StatusPartial},
		{"stalled, then released by an operator's skip", Facts{Expected: []string{"a"}, Latest: latest(fail("a", 1, OutcomeParked), fail("a", 2, OutcomeStalled), ok("a", 3)), Sent: true}, StatusConsumed},
		{"expiry beats a parked event", Facts{Expected: []string{"a"}, Latest: latest(fail("a", 1, OutcomeParked)), Sent: true, ExpireAt: now.Add(-time.Second)}, StatusExpired},

		// 6. SENT, waiting
		{"sent, nobody reported", Facts{Expected: two, Sent: true}, StatusSent},
		{"sent, one of two succeeded", Facts{Expected: two, Latest: latest(ok("member-service", 1)), Sent: true}, StatusSent},
		{"sent to nobody", Facts{Sent: true}, StatusSent},
		{"sent to nobody, someone reported anyway", Facts{Latest: latest(ok("late", 1)), Sent: true}, StatusSent},

		// The expected list is the event's: registry changes after the send do not count.
		{"consumer added to the registry after the send reports a failure: ignored", Facts{Expected: []string{"a"}, Latest: latest(ok("a", 1), fail("added-later", 1, OutcomeFailed)), Sent: true}, StatusConsumed},
		{"consumer added after the send is the only one reporting: still waiting", Facts{Expected: []string{"a"}, Latest: latest(ok("added-later", 1)), Sent: true}, StatusSent},
		{"consumer disabled after the send is still expected", Facts{Expected: []string{"a", "disabled-later"}, Latest: latest(ok("a", 1)), Sent: true}, StatusSent},
		{"consumer disabled after the send that did consume completes it", Facts{Expected: []string{"a", "disabled-later"}, Latest: latest(ok("a", 1), ok("disabled-later", 1)), Sent: true}, StatusConsumed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.f.Now = now
			if got := Derive(c.f); got != c.want {
				t.Errorf("Derive = %s, want %s", got, c.want)
			}
		})
	}
}

func TestStateOf(t *testing.T) {
	for _, c := range []struct {
		a    *Attempt
		want ConsumerState
	}{
		{nil, ConsumerWaiting},
		{&Attempt{Success: true, Outcome: OutcomeSuccess}, ConsumerSucceeded},
		{&Attempt{Outcome: OutcomeRetry}, ConsumerRetrying},
		{&Attempt{Outcome: OutcomeFailed}, ConsumerFailed},
		{&Attempt{Outcome: OutcomePoison}, ConsumerFailed},
		{&Attempt{Outcome: OutcomeDeadLettered}, ConsumerFailed},
		{&Attempt{Outcome: OutcomeParked}, ConsumerParked},
		{&Attempt{Outcome: OutcomeStalled}, ConsumerStalled},
	} {
		if got := StateOf(c.a); got != c.want {
			t.Errorf("StateOf(%+v) = %s, want %s", c.a, got, c.want)
		}
	}
}

func TestDocIDs(t *testing.T) {
	id := EventDocID("evt-1")
	if len(id) != len("xxxx~evt-1") || id[4] != '~' || id[5:] != "evt-1" {
		t.Errorf("EventDocID = %q", id)
	}
	if EventDocID("__reserved__")[:2] == "__" {
		t.Error("a reserved-looking event id made a reserved document id")
	}
	a := AttemptDocID("evt-1", "member-service", 2)
	if a != id+"~member-service~000002" {
		t.Errorf("AttemptDocID = %q", a)
	}
	// Sequential ids spread over prefixes and shards.
	prefixes, shards := map[string]bool{}, map[int]bool{}
	for i := 0; i < 256; i++ {
		e := "order-" + time.Unix(int64(i), 0).UTC().Format("20060102150405")
		prefixes[EventDocID(e)[:2]] = true
		shards[ShardOf(e)] = true
	}
	if len(prefixes) < 64 || len(shards) != DefaultShards {
		t.Errorf("sequential ids not spread: %d two-hex-digit prefixes of 256, %d shards of %d", len(prefixes), len(shards), DefaultShards)
	}
}

func TestAttemptValidate(t *testing.T) {
	good := Attempt{EventID: "e-1", ConsumerID: "member-service", AttemptNo: 1, Success: true, Outcome: OutcomeSuccess, ConsumedAt: time.Now()}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := Attempt{EventID: "a/b", ConsumerID: "Member", AttemptNo: 0, Success: true, Outcome: OutcomeFailed}
	err := bad.Validate()
	for _, field := range []string{"eventId", "consumerId", "attemptNo", "success", "consumedAt"} {
		found := false
		for _, fe := range fieldErrs(err) {
			found = found || fe == field
		}
		if !found {
			t.Errorf("no error for %s in %v", field, err)
		}
	}
	if err := (&Attempt{EventID: "e", ConsumerID: "c", AttemptNo: 1, Outcome: "maybe", ConsumedAt: time.Now()}).Validate(); err == nil {
		t.Error("unknown outcome accepted")
	}
}

func TestTruncate(t *testing.T) {
	if got := Truncate("short", 10); got != "short" {
		t.Error(got)
	}
	long := ""
	for i := 0; i < 100; i++ {
		long += "é"
	}
	got := Truncate(long, 50)
	if len(got) > 50 || got[len(got)-len("(truncated)"):] != "(truncated)" {
		t.Errorf("%q (%d bytes)", got, len(got))
	}
}

// fieldErrs lists the fields an error's FieldErrors name.
func fieldErrs(err error) []string {
	var out []string
	for _, fe := range event.FieldErrors(err) {
		out = append(out, fe.Field)
	}
	return out
}
