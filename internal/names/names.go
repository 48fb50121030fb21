// Package names holds relaybus's naming rules for Pub/Sub resources, taken
// from the company's Pub/Sub conventions:
//
//	topic          <domain>.<aggregate>.<category>   shop.order.events
//	subscription   <topic>.<consumer_service>-<role> shop.order.events.member-service-processor
//	dead letters   <topic>.dlq                       shop.order.events.dlq
//	DLQ monitor    <topic>.dlq-monitor               shop.order.events.dlq-monitor
//
// Names are lowercase and dot-separated; segments are letters, digits and
// hyphens and start with a letter. Invalid names are refused with an error that
// quotes the rule.
package names

import (
	"fmt"
	"strings"
)

// Rules, quoted in errors.
const (
	TopicRule        = "a topic is <domain>.<aggregate>.<category>: 2 or 3 dot-separated segments of [a-z0-9-] starting with a letter, at most 200 characters (e.g. shop.order.events)"
	SubscriptionRule = "a subscription is <topic>.<consumer_service>-<role>, e.g. shop.order.events.member-service-processor"
	ConsumerRule     = "a consumer service is 1 to 63 characters of [a-z0-9-] starting with a letter and not ending with a hyphen"
	RoleRule         = "a consumer role is 1 to 30 characters of [a-z0-9] starting with a letter (reader, writer, processor, ...)"
)

// DeadLetterSuffix ends every dead-letter topic's name.
const DeadLetterSuffix = ".dlq"

// Error is an invalid name with the rule it broke.
type Error struct {
	Kind string // "topic", "subscription", "consumer", "role"
	Name string
	Rule string
}

// Error quotes the name and the rule.
func (e *Error) Error() string { return fmt.Sprintf("invalid %s name %q: %s", e.Kind, e.Name, e.Rule) }

// ValidateTopic checks a topic name. Dead-letter topics (<topic>.dlq) are
// valid when their base topic is.
func ValidateTopic(name string) error {
	base := strings.TrimSuffix(name, DeadLetterSuffix)
	segs := strings.Split(base, ".")
	if len(name) > 200 || len(segs) < 2 || len(segs) > 3 {
		return &Error{Kind: "topic", Name: name, Rule: TopicRule}
	}
	for _, s := range segs {
		if !segment(s, 63) || s == "dlq" {
			return &Error{Kind: "topic", Name: name, Rule: TopicRule}
		}
	}
	return nil
}

// IsDeadLetter reports whether name is a dead-letter topic name.
func IsDeadLetter(topic string) bool { return strings.HasSuffix(topic, DeadLetterSuffix) }

// DeadLetter returns the dead-letter topic of topic.
func DeadLetter(topic string) string { return topic + DeadLetterSuffix }

// DeadLetterMonitor returns the name of the subscription that watches topic's
// dead letters.
func DeadLetterMonitor(topic string) string { return topic + DeadLetterSuffix + "-monitor" }

// Subscription builds <topic>.<consumer>-<role> after validating each part.
func Subscription(topic, consumer, role string) (string, error) {
	if err := ValidateTopic(topic); err != nil {
		return "", err
	}
	if err := ValidateConsumer(consumer); err != nil {
		return "", err
	}
	if err := ValidateRole(role); err != nil {
		return "", err
	}
	return topic + "." + consumer + "-" + role, nil
}

// ParseSubscription splits a subscription name (a bare id, or a full
// projects/<p>/subscriptions/<id> path) into topic, consumer and role.
func ParseSubscription(name string) (topic, consumer, role string, err error) {
	id := name
	if i := strings.LastIndex(id, "/"); i >= 0 {
		id = id[i+1:]
	}
	dot := strings.LastIndex(id, ".")
	if dot < 0 {
		return "", "", "", &Error{Kind: "subscription", Name: name, Rule: SubscriptionRule}
	}
	topic, last := id[:dot], id[dot+1:]
	hy := strings.LastIndex(last, "-")
	if hy < 0 {
		return "", "", "", &Error{Kind: "subscription", Name: name, Rule: SubscriptionRule}
	}
	consumer, role = last[:hy], last[hy+1:]
	if ValidateTopic(topic) != nil || IsDeadLetter(topic) || ValidateConsumer(consumer) != nil || ValidateRole(role) != nil {
		return "", "", "", &Error{Kind: "subscription", Name: name, Rule: SubscriptionRule}
	}
	return topic, consumer, role, nil
}

// ValidateSubscription checks a subscription name.
func ValidateSubscription(name string) error {
	_, _, _, err := ParseSubscription(name)
	return err
}

// ValidateConsumer checks a consumer service name (the ledger's consumerId).
func ValidateConsumer(name string) error {
	if !segment(name, 63) || strings.HasSuffix(name, "-") {
		return &Error{Kind: "consumer", Name: name, Rule: ConsumerRule}
	}
	return nil
}

// ValidateRole checks a consumer role.
func ValidateRole(role string) error {
	if len(role) == 0 || len(role) > 30 || role[0] < 'a' || role[0] > 'z' {
		return &Error{Kind: "role", Name: role, Rule: RoleRule}
	}
	for i := 0; i < len(role); i++ {
		c := role[i]
		if !((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
			return &Error{Kind: "role", Name: role, Rule: RoleRule}
		}
	}
	return nil
}

// ResourceID returns the last path element of a Pub/Sub resource name, so
// "projects/p/topics/shop.order.events" and "shop.order.events" both give
// "shop.order.events".
func ResourceID(name string) string {
	if i := strings.LastIndex(name, "/"); i >= 0 {
		return name[i+1:]
	}
	return name
}

// segment: 1..max of [a-z0-9-], starting with a letter.
func segment(s string, max int) bool {
	if len(s) == 0 || len(s) > max || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-') {
			return false
		}
	}
	return true
}
