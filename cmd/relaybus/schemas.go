package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/relaybus/relaybus/internal/schema"
	"github.com/relaybus/relaybus/shared/topology"
)

func init() {
	commands = append(commands, &command{path: []string{"schemas", "check"},
		short: "refuse a schema change that breaks a consumer or producer (removed field, changed type or number, optional made required)",
		setup: func(fs *flag.FlagSet) runner {
			top := fs.String("topology", "", "the topology file (default $RELAYBUS_TOPOLOGY, or infra/topology.yaml here or above)")
			rev := fs.String("git", "HEAD~1", "compare with the topology and schema files of this git revision")
			base := fs.String("base", "", "compare with the topology and schema files under this directory instead (a checkout, or the directory of its topology.yaml; the deploy passes the record of what is deployed)")
			none := fs.Bool("no-base", false, "there is nothing to compare with (a first deploy): compile the schemas, compare nothing, and say so")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				if *none {
					return schemasCompileOnly(c, *top)
				}
				return schemasCheck(ctx, c, *top, *rev, *base)
			}
		}})
}

// schemasCompileOnly is the check with no base: the schemas must compile,
// and the output says nothing was compared.
func schemasCompileOnly(c *cli, topPath string) error {
	if topPath == "" {
		topPath = os.Getenv(topology.EnvPath)
	}
	head, err := topology.Load(topPath)
	if err != nil {
		return err
	}
	set, err := schema.Load(head)
	if err != nil {
		return err
	}
	n := 0
	for _, tp := range head.Topics {
		n += len(set.Versions(tp.Name))
	}
	fmt.Fprintf(c.out, "schemas check: no base (--no-base): %d schema version(s) compile, compared with nothing\n", n)
	return nil
}

// schemasCheck compiles the head's schemas and the base's, and fails with
// every forbidden change, each on a line.
func schemasCheck(ctx context.Context, c *cli, topPath, rev, base string) error {
	if topPath == "" {
		topPath = os.Getenv(topology.EnvPath)
	}
	head, err := topology.Load(topPath)
	if err != nil {
		return err
	}
	headSet, err := schema.Load(head)
	if err != nil {
		return err
	}
	var (
		baseSet *schema.Set
		against string
	)
	if base != "" {
		baseSet, err = loadBaseDir(base)
		against = base
	} else {
		baseSet, err = loadBaseGit(ctx, head.Dir, rev)
		against = "git " + rev
	}
	if err != nil {
		return err
	}
	findings, n := schema.Evolution(baseSet, headSet)
	for _, f := range findings {
		fmt.Fprintln(c.out, f.String())
	}
	if len(findings) > 0 {
		return fmt.Errorf("schemas check: %d forbidden change(s) against %s: add a field with a new number (optional), or publish a new schemaVersion beside the old one", len(findings), against)
	}
	fmt.Fprintf(c.out, "schemas check: %d schema version(s) compared with %s, no forbidden change\n", n, against)
	return nil
}

// loadBaseDir loads the base from a directory: a checkout (with
// infra/topology.yaml) or the directory of a topology.yaml.
func loadBaseDir(dir string) (*schema.Set, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("base: %w: there is nothing to compare the schemas with (on a first deploy pass --no-base)", err)
	}
	path := filepath.Join(dir, topology.DefaultPath)
	if _, err := os.Stat(path); err != nil {
		path = filepath.Join(dir, "topology.yaml")
	}
	top, err := topology.Load(path)
	if err != nil {
		return nil, fmt.Errorf("base: %w", err)
	}
	s, err := schema.Load(top)
	if err != nil {
		return nil, fmt.Errorf("base: %w", err)
	}
	return s, nil
}

// loadBaseGit loads the base from a git revision: the topology file at the
// same place in the repository as dir's, and its schema files beside it. A
// revision without the topology file has no schemas.
func loadBaseGit(ctx context.Context, dir, rev string) (*schema.Set, error) {
	git := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return out, nil
	}
	prefix, err := git("rev-parse", "--show-prefix")
	if err != nil {
		return nil, fmt.Errorf("base: %w (not in a git checkout? pass --base DIR)", err)
	}
	p := strings.TrimSpace(string(prefix))
	if _, err := git("rev-parse", "--verify", "--quiet", rev+"^{commit}"); err != nil {
		return nil, fmt.Errorf("base: no revision %s in this checkout (a shallow clone? git fetch --deepen=1, or pass --base DIR): %w", rev, err)
	}
	raw, err := git("show", rev+":"+p+"topology.yaml")
	if err != nil { //nolint:nilerr // the revision exists (checked above): the topology is new there, nothing to compare with
		return &schema.Set{}, nil
	}
	top, err := topology.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("base: topology at %s: %w", rev, err)
	}
	s, err := schema.LoadFrom(top, func(name string) ([]byte, error) {
		return git("show", rev+":"+p+filepath.ToSlash(filepath.Clean(name)))
	})
	if err != nil {
		return nil, fmt.Errorf("base: %s: %w", rev, err)
	}
	return s, nil
}
