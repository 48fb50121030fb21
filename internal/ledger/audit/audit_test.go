package audit

import (
	"context"
	"testing"
	"time"

	"cloud.google.com/go/firestore"
	"github.com/relaybus/relaybus/internal/emutest"
)

// Entries come back newest first, filtered by action prefix, topic and
// consumer, with their ids; an entry without a time gets the log's clock.
func TestAppendAndList(t *testing.T) {
	ctx := context.Background()
	c, err := firestore.NewClientWithDatabase(ctx, emutest.FirestoreProject(t), "(default)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	now := time.Date(2026, 11, 20, 8, 0, 0, 0, time.UTC)
	l := New(c, func() time.Time { return now })
	stamped, err := l.Append(ctx, Entry{By: "alice@example.com", Action: ConsumerDisable, Topic: "shop.order.events", ConsumerID: "mailer"})
	if err != nil {
		t.Fatal(err)
	}
	if stamped.ID == "" || !stamped.At.Equal(now) {
		t.Fatalf("appended %+v, want an id and the clock's time", stamped)
	}
	for i, e := range []Entry{
		{By: "bob", Action: LetterReplay, Topic: "shop.order.events", ConsumerID: "mailer"},
		{By: "carol", Action: ConsumerEnable, Topic: "shop.order.events", ConsumerID: "billing"},
		{By: "dave", Action: ConsumerEnable, Topic: "member.points.events", ConsumerID: "mailer"},
	} {
		e.At = now.Add(time.Duration(i+1) * time.Minute)
		if _, err := l.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		q    Query
		want []string
	}{
		{Query{}, []string{"dave", "carol", "bob", "alice@example.com"}},
		{Query{ActionPrefix: "consumer."}, []string{"dave", "carol", "alice@example.com"}},
		{Query{ActionPrefix: "consumer.", Topic: "shop.order.events"}, []string{"carol", "alice@example.com"}},
		{Query{ConsumerID: "mailer", Limit: 2}, []string{"dave", "bob"}},
	} {
		got, err := l.List(ctx, tc.q)
		if err != nil {
			t.Fatal(err)
		}
		var by []string
		for _, e := range got {
			by = append(by, e.By)
			if e.ID == "" {
				t.Errorf("%+v: an entry without its id", tc.q)
			}
		}
		if len(by) != len(tc.want) {
			t.Errorf("%+v: %q, want %q", tc.q, by, tc.want)
			continue
		}
		for i := range by {
			if by[i] != tc.want[i] {
				t.Errorf("%+v: %q, want %q", tc.q, by, tc.want)
				break
			}
		}
	}
}
