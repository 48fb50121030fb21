package privacy

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

func testKey(t *testing.T) Key {
	t.Helper()
	k, err := NewKey("0123456789abcdef-test")
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestModeDefaults(t *testing.T) {
	cases := []struct {
		name string
		rule Rule
		want map[Place]Mode
	}{
		{"nothing declared keeps today's behaviour", Rule{},
			map[Place]Mode{Ledger: Whole, Console: Whole, Archive: Whole, History: Whole, Logs: Whole, Traces: Whole}},
		{"fields redact where payloads are shown, keep them where they are delivered again", Rule{Fields: []string{"/email"}},
			map[Place]Mode{Ledger: Redact, Console: Redact, Archive: Whole, History: Whole, Logs: Redact, Traces: Redact}},
		{"a declared mode wins", Rule{Fields: []string{"/email"}, LedgerMode: Drop, ArchiveMode: Redact},
			map[Place]Mode{Ledger: Drop, Console: Redact, Archive: Redact, History: Whole, Logs: Redact, Traces: Redact}},
		{"a subject alone redacts nothing", Rule{Subject: "/customerId"},
			map[Place]Mode{Ledger: Whole, Console: Whole, Archive: Whole, History: Whole, Logs: Whole, Traces: Whole}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for p, want := range c.want {
				if got := c.rule.Mode(p); got != want {
					t.Errorf("Mode(%s) = %s, want %s", p, got, want)
				}
			}
		})
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		rule Rule
		want []string // substrings, one per error
	}{
		{"empty", Rule{}, nil},
		{"good", Rule{Fields: []string{"/email", "/address/*/line", "/a~1b"}, Subject: "/customerId", LedgerMode: Drop}, nil},
		{"field not a pointer", Rule{Fields: []string{"email"}}, []string{"p.fields[0]: must be a JSON pointer starting with /"}},
		{"bad escape", Rule{Fields: []string{"/a~2"}}, []string{"p.fields[0]: must escape ~ as ~0"}},
		{"subject wildcard", Rule{Subject: "/items/*/id"}, []string{"p.subject: must point at one field"}},
		{"subject not a pointer", Rule{Subject: "customerId"}, []string{"p.subject: must be a JSON pointer"}},
		{"unknown mode", Rule{Fields: []string{"/e"}, ConsoleMode: "hide"}, []string{"p.console: must be whole, redact or drop, not \"hide\""}},
		{"redact without fields", Rule{LogsMode: Redact}, []string{"p.logs: redact needs fields"}},
		{"unknown redaction", Rule{Fields: []string{"/e"}, Redaction: "mask"}, []string{"p.redaction: must be hash or remove"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			errs := c.rule.Validate("p")
			if len(errs) != len(c.want) {
				t.Fatalf("errors %v, want %d: %v", errs, len(c.want), c.want)
			}
			for i, w := range c.want {
				if !strings.Contains(errs[i].Error(), w) {
					t.Errorf("error %q, want it to contain %q", errs[i], w)
				}
			}
		})
	}
}

func TestApply(t *testing.T) {
	k := testKey(t)
	hashOf := func(jsonValue string) string { return k.Hash([]byte(jsonValue)) }
	cases := []struct {
		name     string
		rule     Rule
		place    Place
		payload  string
		want     string
		redacted []string
		dropped  bool
	}{
		{"no rule keeps the payload byte for byte", Rule{}, Ledger, `{"email": "a@b.c"}`, `{"email": "a@b.c"}`, nil, false},
		{"hash one field", Rule{Fields: []string{"/email"}}, Ledger, `{"email":"a@b.c","n":1}`,
			`{"email":"` + hashOf(`"a@b.c"`) + `","n":1}`, []string{"/email"}, false},
		{"remove one field", Rule{Fields: []string{"/email"}, Redaction: RedactRemove}, Console, `{"email":"a@b.c","n":1}`,
			`{"n":1}`, []string{"/email"}, false},
		{"nested and wildcard", Rule{Fields: []string{"/customer/name", "/lines/*/note"}}, Ledger,
			`{"customer":{"name":"Ann","id":"c1"},"lines":[{"note":"x","sku":"s"},{"sku":"t"}]}`,
			`{"customer":{"id":"c1","name":"` + hashOf(`"Ann"`) + `"},"lines":[{"note":"` + hashOf(`"x"`) + `","sku":"s"},{"sku":"t"}]}`,
			[]string{"/customer/name", "/lines/0/note"}, false},
		{"an object value is hashed whole", Rule{Fields: []string{"/address"}}, Ledger, `{"address":{"city":"Oslo"}}`,
			`{"address":"` + hashOf(`{"city":"Oslo"}`) + `"}`, []string{"/address"}, false},
		{"numbers keep their digits", Rule{Fields: []string{"/ssn"}}, Ledger, `{"ssn":"1","amount":12345678901234567890}`,
			`{"amount":12345678901234567890,"ssn":"` + hashOf(`"1"`) + `"}`, []string{"/ssn"}, false},
		{"absent field: payload untouched", Rule{Fields: []string{"/email"}}, Ledger, `{"n": 1}`, `{"n": 1}`, nil, false},
		{"removed array element leaves null", Rule{Fields: []string{"/tags/1"}, Redaction: RedactRemove}, Ledger, `{"tags":["a","b","c"]}`,
			`{"tags":["a",null,"c"]}`, []string{"/tags/1"}, false},
		{"escaped pointer", Rule{Fields: []string{"/a~1b"}, Redaction: RedactRemove}, Ledger, `{"a/b":1,"c":2}`, `{"c":2}`, []string{"/a~1b"}, false},
		{"whole mode for the archive by default", Rule{Fields: []string{"/email"}}, Archive, `{"email":"a@b.c"}`, `{"email":"a@b.c"}`, nil, false},
		{"drop", Rule{Fields: []string{"/email"}, LedgerMode: Drop}, Ledger, `{"email":"a@b.c"}`, ``, nil, true},
		{"not JSON cannot be redacted: nothing kept", Rule{Fields: []string{"/email"}}, Ledger, "\x08\x96\x01", ``, nil, true},
		{"the whole payload is personal", Rule{Fields: []string{""}}, Ledger, `{"a":1}`, ``, nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.rule.Apply(c.place, []byte(c.payload), k)
			if err != nil {
				t.Fatal(err)
			}
			if string(got.Payload) != c.want || got.Dropped != c.dropped || !slices.Equal(got.Redacted, c.redacted) {
				t.Errorf("Apply = %q dropped=%v redacted=%v\nwant   %q dropped=%v redacted=%v", got.Payload, got.Dropped, got.Redacted, c.want, c.dropped, c.redacted)
			}
		})
	}
}

func TestHashesSupportEqualitySearchAndDependOnTheKey(t *testing.T) {
	k := testKey(t)
	r := Rule{Fields: []string{"/email"}}
	a, _ := r.Apply(Ledger, []byte(`{"email":"a@b.c","n":1}`), k)
	b, _ := r.Apply(Ledger, []byte(`{"n":2,"email":"a@b.c"}`), k)
	h := k.HashValue("a@b.c")
	if !strings.Contains(string(a.Payload), h) || !strings.Contains(string(b.Payload), h) {
		t.Errorf("the same value hashes alike: %s, %s, search for %s", a.Payload, b.Payload, h)
	}
	other, _ := NewKey("another-key-of-16-bytes")
	if other.HashValue("a@b.c") == h {
		t.Error("another key gives the same hash")
	}
	if k.SubjectKey("a@b.c") == strings.TrimPrefix(h, HashPrefix) {
		t.Error("a subject key equals a field hash: one would reveal the other")
	}
	if _, err := r.Apply(Ledger, []byte(`{"email":"x"}`), Key{}); !errors.Is(err, ErrNoKey) {
		t.Errorf("no key: %v, want ErrNoKey", err)
	}
	if _, err := NewKey("short"); err == nil {
		t.Error("a 5-byte key was taken")
	}
}

func TestSubjectOf(t *testing.T) {
	cases := []struct {
		subject, payload, want string
		ok                     bool
	}{
		{"/customerId", `{"customerId":"c-1"}`, "c-1", true},
		{"/customer/id", `{"customer":{"id":42}}`, "42", true},
		{"/ids/1", `{"ids":["a","b"]}`, "b", true},
		{"/customerId", `{"customerId":""}`, "", false},
		{"/customerId", `{"customerId":{"x":1}}`, "", false},
		{"/customerId", `not json`, "", false},
		{"", `{"customerId":"c-1"}`, "", false},
	}
	for _, c := range cases {
		got, ok := Rule{Subject: c.subject}.SubjectOf([]byte(c.payload))
		if got != c.want || ok != c.ok {
			t.Errorf("SubjectOf(%q, %s) = %q, %v; want %q, %v", c.subject, c.payload, got, ok, c.want, c.ok)
		}
	}
}

func TestEraseRunsEveryStepAndReports(t *testing.T) {
	var ran []string
	boom := errors.New("store down")
	steps := []Step{
		{Name: "a", Erase: func(_ context.Context, e Erasure) (int, error) { ran = append(ran, "a:"+e.Subject); return 2, nil }},
		{Name: "b", Erase: func(context.Context, Erasure) (int, error) { ran = append(ran, "b"); return 0, boom }},
		{Name: "c", Erase: func(context.Context, Erasure) (int, error) { ran = append(ran, "c"); return 1, nil }},
	}
	rep, err := Erase(context.Background(), steps, Erasure{Subject: "s1", Rules: Rules{"t.a.events": {Subject: "/id"}, "t.b.events": {}}})
	if !errors.Is(err, boom) {
		t.Fatalf("error %v, want the failed step's", err)
	}
	if !slices.Equal(ran, []string{"a:s1", "b", "c"}) {
		t.Errorf("ran %v: every step runs whatever fails", ran)
	}
	if rep.Complete || len(rep.Stores) != 3 || rep.Stores[0].Erased != 2 || rep.Stores[1].Error == "" || !slices.Equal(rep.Topics, []string{"t.a.events"}) {
		t.Errorf("report %+v", rep)
	}
	if _, err := Erase(context.Background(), steps, Erasure{Subject: "  "}); !errors.Is(err, ErrNoSubject) {
		t.Errorf("empty subject: %v", err)
	}
}
