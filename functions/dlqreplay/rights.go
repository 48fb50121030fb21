package dlqreplay

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/relaybus/relaybus/shared/topology"
)

// Roles (topology.Role*), each including the ones before it: a viewer
// reads, an operator acts on what already flows, an admin changes what
// flows. Every route needs one; a caller with no role is refused
// everything but GET /whoami.
const (
	RoleViewer   = topology.RoleViewer
	RoleOperator = topology.RoleOperator
	RoleAdmin    = topology.RoleAdmin
)

// rank orders the roles.
var rank = map[string]int{RoleViewer: 1, RoleOperator: 2, RoleAdmin: 3}

// Binding grants a role to a member on a scope (topology.Operator; the
// topology's operators, DLQREPLAY_ROLES and DLQREPLAY_WRITERS).
type Binding = topology.Operator

// ParseRoles reads DLQREPLAY_ROLES: a JSON list of bindings,
// [{"member": "group:ops@example.com", "role": "admin"}, {"member":
// "serviceAccount:bot@p.iam.gserviceaccount.com", "role": "operator",
// "topics": ["shop.order.events"], "consumers": ["member-service"]}].
func ParseRoles(s string) ([]Binding, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []Binding
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("DLQREPLAY_ROLES: want a JSON list of {\"member\", \"role\", \"topics\", \"consumers\"}: %w", err)
	}
	for i, b := range out {
		if b.Member == Anonymous { // AuthNone's caller, on a local stack
			b.Member = "anonymous@localhost"
		}
		if errs := b.Validate(fmt.Sprintf("DLQREPLAY_ROLES[%d]", i)); len(errs) > 0 {
			return nil, errs[0]
		}
	}
	return out, nil
}

// GroupChecker says whether an email is a member of a group, directly or
// through nested groups (CloudIdentityGroups in production).
type GroupChecker interface {
	IsMember(ctx context.Context, group, email string) (bool, error)
}

// member is a binding's member, parsed.
type member struct {
	group bool
	email string
}

func parseMember(m string) member {
	kind, email, ok := strings.Cut(m, ":")
	if !ok {
		return member{email: strings.ToLower(strings.TrimSpace(m))}
	}
	return member{group: kind == "group", email: strings.ToLower(strings.TrimSpace(email))}
}

// rights are the bindings of one caller.
type rights []Binding

// grants reports whether the bindings give role on topic and consumer:
// one binding of that role or a higher one whose scope covers them. An
// empty topic means every topic, an empty consumer every consumer of the
// topic: only a binding that names the topic (or has no scope) covers
// those.
func (rs rights) grants(role, topic, consumer string) bool {
	for _, b := range rs {
		if rank[b.Role] >= rank[role] && covers(b, topic, consumer) {
			return true
		}
	}
	return false
}

// covers reports whether a binding's scope covers topic and consumer.
func covers(b Binding, topic, consumer string) bool {
	switch {
	case len(b.Topics) == 0 && len(b.Consumers) == 0:
		return true
	case topic != "" && slices.Contains(b.Topics, topic):
		return true
	case consumer != "" && slices.Contains(b.Consumers, consumer):
		return true
	}
	return false
}

// holds reports whether the bindings give role on anything at all.
func (rs rights) holds(role string) bool {
	for _, b := range rs {
		if rank[b.Role] >= rank[role] {
			return true
		}
	}
	return false
}

// rightsOf returns the caller's bindings: those naming them, and those of
// groups they belong to. A group that cannot be checked now is logged and
// counted out (closed).
func (s *server) rightsOf(ctx context.Context, who Principal) rights {
	var out rights
	name := strings.ToLower(who.Name)
	for _, b := range s.bindings {
		m := parseMember(b.Member)
		switch {
		case !m.group && m.email == name:
			out = append(out, b)
		case m.group && s.groups != nil && strings.Contains(name, "@"):
			ok, err := s.groups.IsMember(ctx, m.email, name)
			if err != nil {
				s.logger.ErrorContext(ctx, "dlqreplay: group membership not checked; the group's role is not granted", "group", m.email, "caller", name, "error", err.Error())
				continue
			}
			if ok {
				out = append(out, b)
			}
		}
	}
	return out
}

// target is what an action acts on, for the right it needs.
type target struct {
	// Topic and Consumer scope the action ("" for every topic or every
	// consumer of the topic).
	Topic, Consumer string
}

func (t target) String() string {
	switch {
	case t.Topic == "" && t.Consumer == "":
		return "every topic"
	case t.Consumer == "":
		return "topic " + t.Topic
	case t.Topic == "":
		return "consumer " + t.Consumer + " (on every topic)"
	}
	return "consumer " + t.Consumer + " of " + t.Topic
}

// authorize checks that the caller holds role on t to do what (an
// audit action), and refuses with 403 naming the missing right otherwise;
// a refusal is recorded in the audit log. Roles above viewer are refused
// in read-only mode.
func (g *guard) authorize(r *request, action, role string, t target) error {
	if g.readOnly && rank[role] > rank[RoleViewer] {
		err := fail(http.StatusForbidden, "read_only", "this operations API is read-only (DLQREPLAY_READ_ONLY): nobody may replay, delete, re-push, seek or change consumers")
		g.refused(r, action, t, err.Msg)
		return err
	}
	if r.rights.grants(role, t.Topic, t.Consumer) {
		return nil
	}
	err := fail(http.StatusForbidden, "forbidden", "%s needs the %s role on %s to %s: grant it in infra/topology.yaml operators or DLQREPLAY_ROLES (docs/security.md)",
		r.who.Name, role, t, actionWords(action))
	err.Missing = &missingRight{Role: role, Topic: t.Topic, Consumer: t.Consumer, Action: action}
	g.refused(r, action, t, err.Msg)
	return err
}

// missingRight names, in a 403, the right the caller lacks.
type missingRight struct {
	Role     string `json:"role"`
	Topic    string `json:"topic,omitempty"`
	Consumer string `json:"consumer,omitempty"`
	Action   string `json:"action"`
}

// actionWords says an audit action in words, for messages.
func actionWords(action string) string {
	if w, ok := actionText[action]; ok {
		return w
	}
	return action
}

// authorizeAny is authorize for something that belongs to a topic and is
// expected by consumers: the role on the topic, or on one of them.
func (g *guard) authorizeAny(r *request, action, role, topic string, consumers []string) error {
	for _, c := range consumers {
		if (!g.readOnly || rank[role] <= rank[RoleViewer]) && r.rights.grants(role, topic, c) {
			return nil
		}
	}
	return g.authorize(r, action, role, target{Topic: topic})
}

// grants reports whether the caller may take an action of role on topic
// and consumer now: their rights grant it and, above a viewer's, the API
// is not read-only. Unlike authorize it refuses nothing.
func (g *guard) grants(r *request, role, topic, consumer string) bool {
	return (!g.readOnly || rank[role] <= rank[RoleViewer]) && r.rights.grants(role, topic, consumer)
}
