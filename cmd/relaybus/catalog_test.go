package main

import (
	"encoding/json"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/relaybus/relaybus/shared/topology"
)

// relaybus catalog writes the repository's topology as an AsyncAPI 3.0
// document, YAML by default and JSON with -o json, with a channel per topic
// and a receive operation per consumer; a pull consumer it does not know is
// a usage error naming the flag.
func TestCatalogCommand(t *testing.T) {
	t.Setenv(topology.EnvPath, "")
	top, err := topology.Load("")
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI("catalog", "--version", "2026.11", "--pull-consumers", "shop.order.events.member-service-processor")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	var doc struct {
		AsyncAPI   string `yaml:"asyncapi"`
		Info       struct{ Title, Version string }
		Channels   map[string]struct{ Address string }
		Operations map[string]struct {
			Action   string
			Relaybus map[string]any `yaml:"x-relaybus"`
		}
	}
	if err := yaml.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not YAML: %v\n%s", err, out)
	}
	if doc.AsyncAPI != "3.0.0" || doc.Info.Version != "2026.11" || doc.Info.Title != "relaybus events" {
		t.Errorf("asyncapi %q, info %+v", doc.AsyncAPI, doc.Info)
	}
	for _, tp := range top.Topics {
		if doc.Channels[tp.Name].Address != tp.Name {
			t.Errorf("no channel for %s", tp.Name)
		}
		for _, c := range tp.Consumers {
			if op := doc.Operations[c.Subscription()]; op.Action != "receive" {
				t.Errorf("no receive operation for %s", c.Subscription())
			}
		}
	}
	if d := doc.Operations["shop.order.events.member-service-processor"].Relaybus["delivery"]; d != "pull" {
		t.Errorf("--pull-consumers: member-service's delivery %v, want pull", d)
	}

	code, out, _ = runCLI("-o", "json", "catalog")
	var j map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &j) != nil || j["asyncapi"] != "3.0.0" {
		t.Errorf("-o json: exit %d, not an AsyncAPI JSON document:\n%.300s", code, out)
	}

	code, _, errOut = runCLI("catalog", "--pull-consumers", "shop.order.events.nobody-processor")
	if code != 2 || !strings.Contains(errOut, `--pull-consumers: "shop.order.events.nobody-processor" is no consumer's subscription`) {
		t.Errorf("an unknown pull consumer: exit %d, stderr %q", code, errOut)
	}
}
