package dlqreplay

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/relaybus/relaybus/internal/archive"
	"github.com/relaybus/relaybus/internal/ledger"
	"github.com/relaybus/relaybus/internal/ledger/audit"
	"github.com/relaybus/relaybus/internal/ledger/model"
	"github.com/relaybus/relaybus/internal/privacy"
	"github.com/relaybus/relaybus/shared/event"
	"github.com/relaybus/relaybus/shared/outbox"
)

// personal serves erasure by subject (POST /erasures) and applies the
// topics' console privacy mode to the payloads the API shows.
type personal struct {
	rules privacy.Rules
	key   privacy.Key
	// steps are the stores an erasure goes through, in order: every
	// outbox dlqreplay reaches, the ledger, the dead-letter archive, then
	// Options.EraseSteps.
	steps []privacy.Step
	g     *guard
}

// newPersonal builds the erasure's steps over the stores the API holds.
func newPersonal(rules privacy.Rules, key privacy.Key, dbs databases, led *ledger.Store, arch *archive.Store, extra []privacy.Step, g *guard) *personal {
	p := &personal{rules: rules, key: key, g: g}
	all := dbs.all()
	for _, name := range sortedKeys(all) {
		db := all[name]
		p.steps = append(p.steps, privacy.Step{Name: "outbox:" + name, Erase: func(ctx context.Context, e privacy.Erasure) (int, error) {
			n := 0
			for _, topic := range e.Rules.Subjects() {
				path, _ := e.Rules.Of(topic).SubjectPath()
				k, err := outbox.EraseSubject(ctx, db, topic, path, e.Subject)
				n += k
				if err != nil {
					return n, err
				}
			}
			return n, nil
		}})
	}
	p.steps = append(p.steps,
		privacy.Step{Name: "ledger", Erase: func(ctx context.Context, e privacy.Erasure) (int, error) {
			return led.EraseSubject(ctx, e.SubjectKey, time.Now())
		}},
		privacy.Step{Name: "archive", Erase: func(ctx context.Context, e privacy.Erasure) (int, error) {
			return arch.EraseSubject(ctx, e.Subject, e.Rules, e.By)
		}},
	)
	p.steps = append(p.steps, extra...)
	return p
}

// eraseRequest is POST /erasures' body.
type eraseRequest struct {
	Subject string `json:"subject"`
}

// erase erases every stored payload of one data subject. It needs the admin
// role on every topic. The audit entry names the subject by its keyed hash
// (privacy.Key.SubjectKey), never in plain text. The answer is the report
// store by store; when a store failed the erasure is incomplete (503,
// report included) and is run again: each store's step is idempotent.
func (p *personal) erase(r *request, _ []string) (any, error) {
	var req eraseRequest
	if err := decodeBody(r.Request, &req, false); err != nil {
		return nil, err
	}
	req.Subject = strings.TrimSpace(req.Subject)
	switch {
	case req.Subject == "":
		return nil, badRequest([]*event.FieldError{{Field: "subject", Rule: "the data subject's id is required"}})
	case len(req.Subject) > privacy.MaxSubjectBytes:
		return nil, badRequest([]*event.FieldError{{Field: "subject", Rule: "at most 512 bytes"}})
	}
	if err := p.g.authorize(r, audit.SubjectErase, RoleAdmin, target{}); err != nil {
		return nil, err
	}
	if p.key.IsZero() {
		return nil, fail(http.StatusServiceUnavailable, "no_privacy_key", "erasure needs the privacy key (PRIVACY_KEY): without it the ledger's subject keys cannot be computed")
	}
	skey := p.key.SubjectKey(req.Subject)
	var rep privacy.Report
	err := p.g.run(r, audit.Entry{Action: audit.SubjectErase, Detail: "erase the payloads of subject key " + skey}, func(*step) (string, error) {
		var err error
		rep, err = privacy.Erase(r.Context(), p.steps, privacy.Erasure{Subject: req.Subject, SubjectKey: skey, Rules: p.rules, By: r.who.Name})
		if err != nil {
			e := fail(http.StatusServiceUnavailable, "erasure_incomplete", "erasure of subject key %s is incomplete: %s; run it again (request %s)", skey, failedStores(rep), r.id)
			e.RequestID = r.id
			return "", e
		}
		return "erased the payloads of subject key " + skey + ": " + erasedCounts(rep), nil
	})
	if err != nil {
		return nil, err
	}
	return map[string]any{"subjectKey": skey, "report": rep}, nil
}

func failedStores(rep privacy.Report) string {
	var out []string
	for _, s := range rep.Stores {
		if s.Error != "" {
			out = append(out, s.Store+" failed")
		}
	}
	return strings.Join(out, ", ")
}

func erasedCounts(rep privacy.Report) string {
	var out []string
	for _, s := range rep.Stores {
		out = append(out, s.Store+" "+strconv.Itoa(s.Erased))
	}
	return strings.Join(out, ", ")
}

// console returns the event document as the console may show it: the
// topic's console mode applied to what the ledger kept.
func (p *personal) console(d model.Event) model.Event {
	if p == nil || len(d.Payload) == 0 {
		return d
	}
	r, ok := p.rules[d.Topic]
	if !ok || (r.Mode(privacy.Console) == privacy.Redact && r.Mode(privacy.Ledger) == privacy.Redact) {
		return d // the ledger redacted the same fields already
	}
	res, err := r.Apply(privacy.Console, d.Payload, p.key)
	if err != nil || res.Dropped {
		d.Payload, d.PayloadWithheld, d.RedactedFields = nil, true, nil
		return d
	}
	d.Payload = res.Payload
	if len(res.Redacted) > 0 {
		d.RedactedFields = mergeSorted(d.RedactedFields, res.Redacted)
	}
	return d
}

func mergeSorted(a, b []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range append(append([]string{}, a...), b...) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// whole reports whether the ledger holds the event's payload as produced
// (a re-push may rebuild the event from it).
func whole(d model.Event) bool {
	return !d.PayloadErased && !d.PayloadWithheld && len(d.RedactedFields) == 0
}
