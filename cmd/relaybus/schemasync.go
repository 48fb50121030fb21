package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/api/iterator"

	"github.com/relaybus/relaybus/shared/topology"
)

func init() {
	commands = append(commands, &command{path: []string{"schemas", "sync"},
		short: "make each topic's Pub/Sub schema hold one revision per declared version, newest last (the deploy runs it)",
		setup: func(fs *flag.FlagSet) runner {
			top := fs.String("topology", "", "the topology file (default $RELAYBUS_TOPOLOGY, or infra/topology.yaml here or above)")
			project := fs.String("project", os.Getenv("GOOGLE_CLOUD_PROJECT"), "the Google Cloud project ($GOOGLE_CLOUD_PROJECT)")
			topic := fs.String("topic", "", "sync this topic's schema only (default every topic with a protobuf or Avro schema)")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				if *project == "" {
					return usageError("schemas sync: --project is required")
				}
				return schemasSync(ctx, c, *top, *project, *topic)
			}
		}})
}

// schemasSync brings every topic's schema revisions to the declared
// versions. Pub/Sub keeps at most 20 revisions of a schema and Terraform
// holds only the newest definition; committing every declared version on
// each change (and never deleting one) hit the cap after a few versions.
func schemasSync(ctx context.Context, c *cli, topPath, project, only string) error {
	if topPath == "" {
		topPath = os.Getenv(topology.EnvPath)
	}
	top, err := topology.Load(topPath)
	if err != nil {
		return err
	}
	client, err := vkit.NewSchemaClient(ctx)
	if err != nil {
		return fmt.Errorf("schemas sync: %w", err)
	}
	defer client.Close()
	n := 0
	for _, tp := range top.Topics {
		if only != "" && tp.Name != only {
			continue
		}
		typ, defs, err := declaredDefinitions(top, tp)
		if err != nil {
			return err
		}
		if len(defs) == 0 {
			continue
		}
		n++
		r, err := syncRevisions(ctx, client, "projects/"+project+"/schemas/"+tp.Name, typ, defs)
		if err != nil {
			return fmt.Errorf("schemas sync: %s: %w", tp.Name, err)
		}
		fmt.Fprintf(c.out, "%s: %d revision(s), %d committed, %d deleted\n", tp.Name, r.held, r.committed, r.deleted)
	}
	if only != "" && n == 0 {
		return fmt.Errorf("schemas sync: topic %q has no protobuf or Avro schema in the topology", only)
	}
	return nil
}

// declaredDefinitions are a topic's Pub/Sub schema definitions, oldest
// version first (v2 before v10), as Terraform's topic_schemas orders them;
// a JSON Schema topic has none (Pub/Sub has no such type).
func declaredDefinitions(top *topology.Topology, tp topology.Topic) (pubsubpb.Schema_Type, []string, error) {
	schemas := append([]topology.Schema(nil), tp.Schemas...)
	if len(schemas) == 0 || schemas[0].Type == "jsonschema" {
		return 0, nil, nil
	}
	num := func(v string) int {
		var n int
		if _, err := fmt.Sscanf(v, "v%d", &n); err != nil {
			return 0
		}
		return n
	}
	sort.SliceStable(schemas, func(i, j int) bool { return num(schemas[i].Version) < num(schemas[j].Version) })
	typ := pubsubpb.Schema_PROTOCOL_BUFFER
	if schemas[0].Type == "avro" {
		typ = pubsubpb.Schema_AVRO
	}
	var defs []string
	for _, s := range schemas {
		b, err := os.ReadFile(filepath.Join(top.Dir, s.File))
		if err != nil {
			return 0, nil, fmt.Errorf("schemas sync: %s %s: %w", tp.Name, s.Version, err)
		}
		defs = append(defs, string(b))
	}
	return typ, defs, nil
}

// schemaAPI is the part of the Pub/Sub schema service the sync uses.
type schemaAPI interface {
	ListSchemaRevisions(ctx context.Context, req *pubsubpb.ListSchemaRevisionsRequest, opts ...gax.CallOption) *vkit.SchemaIterator
	CommitSchema(ctx context.Context, req *pubsubpb.CommitSchemaRequest, opts ...gax.CallOption) (*pubsubpb.Schema, error)
	DeleteSchemaRevision(ctx context.Context, req *pubsubpb.DeleteSchemaRevisionRequest, opts ...gax.CallOption) (*pubsubpb.Schema, error)
}

type syncResult struct{ held, committed, deleted int }

// revisions lists a schema's revisions, oldest first (the API lists the
// newest first).
func revisions(ctx context.Context, api schemaAPI, name string) ([]*pubsubpb.Schema, error) {
	it := api.ListSchemaRevisions(ctx, &pubsubpb.ListSchemaRevisionsRequest{Name: name, View: pubsubpb.SchemaView_FULL})
	var out []*pubsubpb.Schema
	for {
		s, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	sort.SliceStable(out, func(i, j int) bool {
		return out[i].GetRevisionCreateTime().AsTime().Before(out[j].GetRevisionCreateTime().AsTime())
	})
	return out, nil
}

// syncRevisions makes the schema name hold exactly one revision per
// definition of defs (oldest first), the newest definition as its latest
// revision: it deletes revisions of definitions no longer declared first
// (never the latest: Pub/Sub keeps at least one), commits what is
// missing, commits the newest again if it is not the latest, then deletes
// what is left over. Pub/Sub accepts a message valid against any revision
// of a topic's schema, so the revisions are exactly the versions
// producers may send.
func syncRevisions(ctx context.Context, api schemaAPI, name string, typ pubsubpb.Schema_Type, defs []string) (syncResult, error) {
	var r syncResult
	declared := map[string]bool{}
	for _, d := range defs {
		declared[d] = true
	}
	newest := defs[len(defs)-1]
	revs, err := revisions(ctx, api, name)
	if err != nil {
		return r, err
	}
	if len(revs) == 0 {
		return r, fmt.Errorf("schema %s does not exist (Terraform's google_pubsub_schema creates it before the sync)", name)
	}
	del := func(s *pubsubpb.Schema) error {
		if _, err := api.DeleteSchemaRevision(ctx, &pubsubpb.DeleteSchemaRevisionRequest{Name: name + "@" + s.GetRevisionId()}); err != nil {
			return fmt.Errorf("delete revision %s: %w", s.GetRevisionId(), err)
		}
		r.deleted++
		return nil
	}
	// 1. Room first: revisions of retired definitions go (not the latest).
	held := map[string]bool{}
	for i, s := range revs {
		if !declared[s.GetDefinition()] && i < len(revs)-1 {
			if err := del(s); err != nil {
				return r, err
			}
			continue
		}
		held[s.GetDefinition()] = true
	}
	// 2. What is missing, oldest first; 3. the newest last.
	commit := func(def string) error {
		if _, err := api.CommitSchema(ctx, &pubsubpb.CommitSchemaRequest{Name: name, Schema: &pubsubpb.Schema{Name: name, Type: typ, Definition: def}}); err != nil {
			return fmt.Errorf("commit revision: %w", err)
		}
		r.committed++
		return nil
	}
	for _, d := range defs {
		if !held[d] {
			if err := commit(d); err != nil {
				return r, err
			}
			held[d] = true
		}
	}
	if revs, err = revisions(ctx, api, name); err != nil {
		return r, err
	}
	if revs[len(revs)-1].GetDefinition() != newest {
		if err := commit(newest); err != nil {
			return r, err
		}
		if revs, err = revisions(ctx, api, name); err != nil {
			return r, err
		}
	}
	// 4. One revision per declared definition, its newest; nothing else.
	last := map[string]int{}
	for i, s := range revs {
		last[s.GetDefinition()] = i
	}
	r.held = len(revs)
	for i, s := range revs[:len(revs)-1] {
		if !declared[s.GetDefinition()] || last[s.GetDefinition()] != i {
			if err := del(s); err != nil {
				return r, err
			}
			r.held--
		}
	}
	return r, nil
}
