package dlqreplay

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	cloudidentity "google.golang.org/api/cloudidentity/v1"
	"google.golang.org/api/option"
)

// DefaultGroupsTTL is how long CloudIdentityGroups keeps an answer: a
// member removed from a group keeps its role at most this long.
const DefaultGroupsTTL = 5 * time.Minute

// CloudIdentityGroups checks group membership with the Cloud Identity
// Groups API (groups.lookup, then memberships.checkTransitiveMembership:
// nested groups count), caching each answer for TTL. The function's service
// account must be allowed to see the groups' members (a member of each
// group with the right to view members, or a Workspace Groups Reader), and
// the project must have cloudidentity.googleapis.com enabled.
type CloudIdentityGroups struct {
	svc *cloudidentity.Service
	ttl time.Duration
	now func() time.Time

	mu     sync.Mutex
	names  map[string]string // group email -> groups/{id}
	member map[[2]string]cached
}

type cached struct {
	ok  bool
	exp time.Time
}

// NewCloudIdentityGroups returns a checker; opts reach the API client
// (tests point it at their own endpoint). ttl zero is DefaultGroupsTTL.
func NewCloudIdentityGroups(ctx context.Context, ttl time.Duration, opts ...option.ClientOption) (*CloudIdentityGroups, error) {
	svc, err := cloudidentity.NewService(ctx, append([]option.ClientOption{option.WithScopes(cloudidentity.CloudIdentityGroupsReadonlyScope)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("dlqreplay: Cloud Identity client: %w", err)
	}
	if ttl <= 0 {
		ttl = DefaultGroupsTTL
	}
	return &CloudIdentityGroups{svc: svc, ttl: ttl, now: time.Now, names: map[string]string{}, member: map[[2]string]cached{}}, nil
}

// IsMember reports whether email belongs to group, directly or through
// nested groups. Errors are not cached.
func (g *CloudIdentityGroups) IsMember(ctx context.Context, group, email string) (bool, error) {
	group, email = strings.ToLower(group), strings.ToLower(email)
	key := [2]string{group, email}
	g.mu.Lock()
	c, hit := g.member[key]
	name := g.names[group]
	g.mu.Unlock()
	if hit && g.now().Before(c.exp) {
		return c.ok, nil
	}
	if name == "" {
		res, err := g.svc.Groups.Lookup().GroupKeyId(group).Context(ctx).Do()
		if err != nil {
			return false, fmt.Errorf("look up group %s: %w", group, err)
		}
		name = res.Name
	}
	res, err := g.svc.Groups.Memberships.CheckTransitiveMembership(name).
		Query(fmt.Sprintf("member_key_id == '%s'", strings.ReplaceAll(email, "'", ""))).Context(ctx).Do()
	if err != nil {
		return false, fmt.Errorf("check %s in group %s: %w", email, group, err)
	}
	g.mu.Lock()
	g.names[group] = name
	g.member[key] = cached{ok: res.HasMembership, exp: g.now().Add(g.ttl)}
	g.mu.Unlock()
	return res.HasMembership, nil
}
