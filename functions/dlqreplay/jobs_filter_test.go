package dlqreplay

import (
	"testing"
	"time"

	"github.com/relaybus/relaybus/internal/ledger/model"
)

// What each filter matches, by the consumer's latest attempt and the time
// the event occurred.
func TestReplayFilterMatch(t *testing.T) {
	at := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	base := replayFilter{Topic: "shop.order.events", Consumer: "member-service", Since: at, Until: at.Add(40 * time.Minute), Outcome: FilterDeadLettered}
	ev := func(occurred time.Time, consumer string, o model.Outcome, code string) *model.Event {
		return &model.Event{Topic: "shop.order.events", OccurredAt: occurred,
			Latest: map[string]model.AttemptMark{consumer: {AttemptNo: 1, Outcome: o, ErrorCode: code, Success: o == model.OutcomeSuccess}}}
	}
	in := at.Add(10 * time.Minute)
	with := func(change func(*replayFilter)) replayFilter { f := base; change(&f); return f }
	for _, c := range []struct {
		name string
		f    replayFilter
		e    *model.Event
		want bool
	}{
		{"dead-lettered", base, ev(in, "member-service", model.OutcomeDeadLettered, "timeout"), true},
		{"poison is dead-lettered", base, ev(in, "member-service", model.OutcomePoison, "malformed"), true},
		{"a failure is not dead-lettered", base, ev(in, "member-service", model.OutcomeFailed, "declined"), false},
		{"success", base, ev(in, "member-service", model.OutcomeSuccess, ""), false},
		{"parked", base, ev(in, "member-service", model.OutcomeParked, ""), false},
		{"another consumer's", base, ev(in, "message-service", model.OutcomeDeadLettered, "timeout"), false},
		{"another topic", base, &model.Event{Topic: "member.points.events", OccurredAt: in,
			Latest: map[string]model.AttemptMark{"member-service": {Outcome: model.OutcomeDeadLettered}}}, false},
		{"at since", base, ev(at, "member-service", model.OutcomeDeadLettered, ""), true},
		{"before since", base, ev(at.Add(-time.Nanosecond), "member-service", model.OutcomeDeadLettered, ""), false},
		{"at until", base, ev(at.Add(40*time.Minute), "member-service", model.OutcomeDeadLettered, ""), false},
		{"failed: permanent", with(func(f *replayFilter) { f.Outcome = FilterFailed }), ev(in, "member-service", model.OutcomeFailed, "declined"), true},
		{"failed: still retried", with(func(f *replayFilter) { f.Outcome = FilterFailed }), ev(in, "member-service", model.OutcomeRetry, "timeout"), true},
		{"failed: not a dead letter", with(func(f *replayFilter) { f.Outcome = FilterFailed }), ev(in, "member-service", model.OutcomeDeadLettered, "timeout"), false},
		{"transient: dead-lettered after retries", with(func(f *replayFilter) { f.ErrorClass = "transient" }), ev(in, "member-service", model.OutcomeDeadLettered, "timeout"), true},
		{"transient: not poison", with(func(f *replayFilter) { f.ErrorClass = "transient" }), ev(in, "member-service", model.OutcomePoison, "malformed"), false},
		{"poison", with(func(f *replayFilter) { f.ErrorClass = "poison" }), ev(in, "member-service", model.OutcomePoison, "malformed"), true},
		{"permanent failure", with(func(f *replayFilter) { f.Outcome, f.ErrorClass = FilterFailed, "permanent" }), ev(in, "member-service", model.OutcomeFailed, "declined"), true},
		{"permanent: not a retry", with(func(f *replayFilter) { f.Outcome, f.ErrorClass = FilterFailed, "permanent" }), ev(in, "member-service", model.OutcomeRetry, "timeout"), false},
		{"code", with(func(f *replayFilter) { f.ErrorCode = "timeout" }), ev(in, "member-service", model.OutcomeDeadLettered, "timeout"), true},
		{"another code", with(func(f *replayFilter) { f.ErrorCode = "timeout" }), ev(in, "member-service", model.OutcomeDeadLettered, "gap"), false},
		{"no attempt of the consumer", base, &model.Event{Topic: "shop.order.events", OccurredAt: in}, false},
	} {
		if _, got := c.f.match(c.e); got != c.want {
			t.Errorf("%s: match = %v, want %v", c.name, got, c.want)
		}
	}
}
