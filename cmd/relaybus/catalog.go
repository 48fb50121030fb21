package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/relaybus/relaybus/internal/catalog"
	"github.com/relaybus/relaybus/internal/schema"
	"github.com/relaybus/relaybus/shared/topology"
)

// relaybus catalog reads the topology file, as the other commands that
// describe a deployment before it exists do (schemas check, deploy check):
// the document is a build artifact made from a checkout, in CI or on a
// laptop, with no API, credentials or deployment needed, and it says what
// the checkout will deploy. The live catalog (the registry's state) is the
// API's GET /catalog.
func init() {
	commands = append(commands, &command{path: []string{"catalog"},
		short: "write the event catalog (topics, schemas, publishers, consumers) as an AsyncAPI 3.0 document, from the topology file",
		setup: func(fs *flag.FlagSet) runner {
			top := fs.String("topology", "", "the topology file (default $RELAYBUS_TOPOLOGY, or infra/topology.yaml here or above)")
			title := fs.String("title", "", `the document's info.title (default "relaybus events")`)
			version := fs.String("version", "", "the document's info.version, the catalog's own version: a release or a commit (default 0.0.0)")
			pull := fs.String("pull-consumers", "", "comma-separated logical subscriptions deployed in pull mode (Terraform's pull_mode), shown as pull delivery")
			return func(_ context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				return writeCatalog(c, *top, catalog.Info{Title: *title, Version: *version}, *pull)
			}
		}})
}

// writeCatalog builds the catalog of a topology file and writes it as
// AsyncAPI: YAML, or JSON with -o json.
func writeCatalog(c *cli, topPath string, info catalog.Info, pull string) error {
	if topPath == "" {
		topPath = os.Getenv(topology.EnvPath)
	}
	top, err := topology.Load(topPath)
	if err != nil {
		return err
	}
	set, err := schema.Load(top)
	if err != nil {
		return err
	}
	var pulled []string
	for p := range strings.SplitSeq(pull, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if _, ok := top.Consumer(p); !ok {
			return usageError(fmt.Sprintf("--pull-consumers: %q is no consumer's subscription (<topic>.<service>-<role>) in the topology", p))
		}
		pulled = append(pulled, p)
	}
	doc := catalog.Build(top, catalog.Options{Schemas: set, PullConsumers: pulled}).AsyncAPI(info)
	if c.output == "json" {
		enc := json.NewEncoder(c.out)
		enc.SetIndent("", "  ")
		return enc.Encode(doc)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("catalog: %w", err)
	}
	_, err = c.out.Write(buf.Bytes())
	return err
}
