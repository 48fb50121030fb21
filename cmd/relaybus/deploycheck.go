package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/oauth2/google"

	"github.com/relaybus/relaybus/internal/deploycheck"
	"github.com/relaybus/relaybus/shared/topology"
)

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// newCloud is how deploy check reaches Google Cloud; tests replace it.
var newCloud = func(ctx context.Context) (deploycheck.Cloud, error) {
	client, err := google.DefaultClient(ctx, "https://www.googleapis.com/auth/cloud-platform")
	if err != nil {
		return nil, fmt.Errorf("deploy check: Google credentials (gcloud auth application-default login, or --offline): %w", err)
	}
	return deploycheck.REST{Client: client}, nil
}

func init() {
	commands = append(commands, &command{path: []string{"deploy", "check"},
		short: "preflight before terraform apply: APIs, the deploy account's roles, the state bucket, the tfvars' names and sizes",
		setup: func(fs *flag.FlagSet) runner {
			project := fs.String("project", os.Getenv("GOOGLE_CLOUD_PROJECT"), "the project to deploy to ($GOOGLE_CLOUD_PROJECT)")
			region := fs.String("region", "europe-west1", "the deploy's region")
			bucket := fs.String("state-bucket", "", "the Terraform state bucket (terraform init -backend-config=bucket=...)")
			account := fs.String("build-account", "", "the deploy's service account email, whose project roles are checked")
			top := fs.String("topology", "", "the topology file (default $RELAYBUS_TOPOLOGY, or infra/topology.yaml here or above)")
			tfDir := fs.String("terraform-dir", "", "infra/terraform (default: beside the topology file)")
			offline := fs.Bool("offline", false, "check the configuration only (tfvars, topology), without asking Google Cloud")
			var varFiles multi
			fs.Var(&varFiles, "var-file", "a tfvars file, as terraform -var-file (repeatable)")
			return func(ctx context.Context, c *cli, args []string) error {
				if err := exactly(args); err != nil {
					return err
				}
				o := deploycheck.Options{Project: *project, Region: *region, StateBucket: *bucket, BuildAccount: *account, VarFiles: varFiles}
				path := *top
				if path == "" {
					path = os.Getenv(topology.EnvPath)
				}
				t, err := topology.Load(path)
				if err != nil {
					return err
				}
				o.Topology = t
				o.TerraformDir = *tfDir
				if o.TerraformDir == "" {
					o.TerraformDir = filepath.Join(t.Dir, "terraform")
				}
				if !*offline {
					if o.Project == "" {
						return usageError("deploy check: --project is required (or --offline)")
					}
					if o.Cloud, err = newCloud(ctx); err != nil {
						return err
					}
				}
				problems, err := deploycheck.Run(ctx, o)
				for _, p := range problems {
					fmt.Fprintln(c.out, p.String())
				}
				if err != nil {
					return err
				}
				if len(problems) > 0 {
					return fmt.Errorf("deploy check: %d problem(s); nothing was created", len(problems))
				}
				what := "the configuration"
				if !*offline {
					what = "the configuration and project " + o.Project
				}
				fmt.Fprintf(c.out, "deploy check: %s: ready to apply\n", what)
				return nil
			}
		}})
}
