package topology

import (
	"strings"
	"testing"

	"github.com/relaybus/relaybus/internal/privacy"
)

func TestPrivacyRulesAreReadAndChecked(t *testing.T) {
	base := `
rollup: {topic: relaybus.ledger.rollup}
topics:
  - name: shop.order.events
    consumers:
      - service: member-service
  - name: shop.customer.events
    consumers:
      - service: member-service
`
	top, err := Parse([]byte(base + `    privacy:
      fields: [/email, /address]
      subject: /customerId
      ledger: drop
`))
	if err != nil {
		t.Fatal(err)
	}
	if top.Topics[0].Privacy.Declared() {
		t.Errorf("a topic that declares nothing has a rule: %+v", top.Topics[0].Privacy)
	}
	r := top.Topics[1].Privacy.rule()
	if r.Subject != "/customerId" || r.Mode(privacy.Ledger) != privacy.Drop || r.Mode(privacy.Console) != privacy.Redact || len(r.Fields) != 2 {
		t.Errorf("rule %+v", r)
	}
	_, err = Parse([]byte(base + "    privacy: {fields: [email], console: hide}\n"))
	for _, want := range []string{
		"topics[1] (shop.customer.events).privacy.fields[0]: must be a JSON pointer",
		`topics[1] (shop.customer.events).privacy.console: must be whole, redact or drop, not "hide"`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to contain %q", err, want)
		}
	}
}
