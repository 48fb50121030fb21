// Package deploycheck is the preflight of a deploy (`relaybus deploy
// check`): what would make `terraform apply` fail, or deploy something that
// cannot work, found before anything is created, each problem named with
// its fix.
//
// Two kinds of checks. Those over the configuration (the tfvars, the
// topology, the Terraform variables) run offline and are exact: variable
// names, Postgres connections against the instance's and the tier's limit,
// pull-mode consumer names, the pull worker's in-flight bound against its
// pool, schema revisions against Pub/Sub's cap. Those over the project (its
// APIs, the build account's roles, the state bucket) ask Google Cloud
// through Cloud, which the CLI implements with the REST APIs and tests with
// a fake server.
package deploycheck

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/relaybus/relaybus/shared/topology"
)

// Options say what to check.
type Options struct {
	// Project and Region are the deploy's (project_id, region).
	Project, Region string
	// StateBucket is the Terraform state bucket (terraform init's bucket).
	StateBucket string
	// BuildAccount is the deploy's service account email, whose project
	// roles are checked (empty: not checked).
	BuildAccount string
	// TerraformDir is infra/terraform: the variables the tfvars may set.
	TerraformDir string
	// Topology is the topology the deploy reads.
	Topology *topology.Topology
	// VarFiles are the tfvars files, in order (later ones win).
	VarFiles []string
	// Cloud answers the project checks; nil runs the offline checks only.
	Cloud Cloud
}

// Problem is one thing that would break the deploy, and how to fix it.
type Problem struct {
	// Check names the check (apis, build-account, state-bucket, tfvars,
	// connections, pull-mode, schemas).
	Check string
	// What is wrong, with the numbers.
	What string
	// Fix is what to do about it (a command where there is one).
	Fix string
}

func (p Problem) String() string { return p.Check + ": " + p.What + "\n  fix: " + p.Fix }

// Cloud is what the project checks ask Google Cloud.
type Cloud interface {
	// ServiceEnabled reports whether an API is enabled on the project.
	ServiceEnabled(ctx context.Context, project, service string) (bool, error)
	// ProjectRoles lists the roles member holds on the project.
	ProjectRoles(ctx context.Context, project, member string) ([]string, error)
	// Bucket reports whether a bucket exists and has object versioning.
	Bucket(ctx context.Context, name string) (exists, versioned bool, err error)
}

// RequiredAPIs must be on before the first plan: the provider reads the
// project through Cloud Resource Manager and enables every other API
// through Service Usage; Cloud Build and Artifact Registry built the images.
var RequiredAPIs = []string{
	"cloudresourcemanager.googleapis.com", "serviceusage.googleapis.com",
	"cloudbuild.googleapis.com", "artifactregistry.googleapis.com", "iam.googleapis.com",
}

// DeployRoles are the project roles the deploy account needs
// (cloudbuild.deploy.yaml's header and docs/deploying.md list them with
// the grants on single resources).
var DeployRoles = []string{
	"roles/logging.logWriter", "roles/serviceusage.serviceUsageAdmin", "roles/resourcemanager.projectIamAdmin",
	"roles/iam.roleAdmin", "roles/iam.serviceAccountAdmin", "roles/iam.serviceAccountUser", "roles/run.admin",
	"roles/pubsub.admin", "roles/eventarc.admin", "roles/cloudscheduler.admin", "roles/datastore.owner",
	"roles/cloudsql.admin", "roles/secretmanager.admin", "roles/logging.configWriter", "roles/monitoring.editor",
}

// MaxSchemaRevisions is Pub/Sub's cap on a schema's revisions
// (https://cloud.google.com/pubsub/quotas#resource_limits: 20 per schema).
// relaybus keeps one revision per declared version, and commits the newest
// once more while it syncs, so a topic may declare at most one fewer.
const MaxSchemaRevisions = 20

// Run runs every check and returns the problems found, in a stable order;
// an error is a check that could not run (a tfvars file that does not
// parse, the cloud unreachable).
func Run(ctx context.Context, o Options) ([]Problem, error) {
	vars, err := loadVarFiles(o.VarFiles)
	if err != nil {
		return nil, err
	}
	var out []Problem
	declared, err := declaredVariables(o.TerraformDir)
	if err != nil {
		return nil, err
	}
	for _, name := range sortedKeys(vars) {
		if !declared[name] {
			out = append(out, Problem{"tfvars", fmt.Sprintf("%q is not a variable of infra/terraform (a typo is ignored by nothing: Terraform refuses it at plan)", name),
				"remove it or use one of: " + strings.Join(sortedKeys(declared), ", ")})
		}
	}
	if o.Topology != nil {
		out = append(out, connections(o.Topology, vars)...)
		out = append(out, pullMode(o.Topology, vars)...)
		out = append(out, schemaRevisions(o.Topology)...)
	}
	if o.Cloud != nil {
		p, err := projectChecks(ctx, o)
		if err != nil {
			return out, err
		}
		out = append(out, p...)
	}
	return out, nil
}

func projectChecks(ctx context.Context, o Options) ([]Problem, error) {
	var out []Problem
	var off []string
	for _, api := range RequiredAPIs {
		on, err := o.Cloud.ServiceEnabled(ctx, o.Project, api)
		if err != nil {
			return out, fmt.Errorf("deploy check: apis: %w", err)
		}
		if !on {
			off = append(off, api)
		}
	}
	if len(off) > 0 {
		out = append(out, Problem{"apis", "not enabled on " + o.Project + ": " + strings.Join(off, ", "),
			"gcloud services enable " + strings.Join(off, " ") + " --project=" + o.Project})
	}
	if o.BuildAccount != "" {
		member := o.BuildAccount
		if !strings.Contains(member, ":") {
			member = "serviceAccount:" + member
		}
		have, err := o.Cloud.ProjectRoles(ctx, o.Project, member)
		if err != nil {
			return out, fmt.Errorf("deploy check: build account: %w", err)
		}
		held := map[string]bool{}
		for _, r := range have {
			held[r] = true
		}
		var missing []string
		for _, r := range DeployRoles {
			if !held[r] && !held["roles/owner"] {
				missing = append(missing, r)
			}
		}
		if len(missing) > 0 {
			var fix []string
			for _, r := range missing {
				fix = append(fix, fmt.Sprintf("gcloud projects add-iam-policy-binding %s --member=%s --role=%s --condition=None", o.Project, member, r))
			}
			out = append(out, Problem{"build-account", fmt.Sprintf("%s lacks %d project role(s) the deploy needs: %s", o.BuildAccount, len(missing), strings.Join(missing, ", ")),
				strings.Join(fix, "\n       ")})
		}
	}
	if o.StateBucket != "" {
		exists, versioned, err := o.Cloud.Bucket(ctx, o.StateBucket)
		if err != nil {
			return out, fmt.Errorf("deploy check: state bucket: %w", err)
		}
		switch {
		case !exists:
			out = append(out, Problem{"state-bucket", "gs://" + o.StateBucket + " does not exist (or the caller may not read it): terraform init fails",
				fmt.Sprintf("gcloud storage buckets create gs://%s --project=%s --location=%s --uniform-bucket-level-access && gcloud storage buckets update gs://%s --versioning", o.StateBucket, o.Project, o.Region, o.StateBucket)})
		case !versioned:
			out = append(out, Problem{"state-bucket", "gs://" + o.StateBucket + " keeps no object versions: a bad apply's state cannot be recovered",
				"gcloud storage buckets update gs://" + o.StateBucket + " --versioning"})
		}
	}
	return out, nil
}

// ---- tfvars -------------------------------------------------------------

// loadVarFiles reads tfvars files (HCL attributes of literal values), later
// files winning.
func loadVarFiles(paths []string) (map[string]cty.Value, error) {
	out := map[string]cty.Value{}
	for _, p := range paths {
		body, err := parseHCL(p)
		if err != nil {
			return nil, err
		}
		for name, a := range body.Attributes {
			v, diags := a.Expr.Value(nil)
			if diags.HasErrors() {
				return nil, fmt.Errorf("deploy check: %s: %s: a tfvars value must be a literal: %s", p, name, diags.Error())
			}
			out[name] = v
		}
	}
	return out, nil
}

// parseHCL reads and parses one HCL file (a tfvars or a .tf file).
func parseHCL(path string) (*hclsyntax.Body, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("deploy check: %w", err)
	}
	f, diags := hclsyntax.ParseConfig(src, path, hcl.InitialPos)
	if diags.HasErrors() {
		return nil, fmt.Errorf("deploy check: %s", diags.Error())
	}
	return f.Body.(*hclsyntax.Body), nil
}

// declaredVariables are the variable blocks of the Terraform configuration.
func declaredVariables(dir string) (map[string]bool, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.tf"))
	if err != nil || len(paths) == 0 {
		return nil, fmt.Errorf("deploy check: no .tf files in %s (run it from the repository, or pass --terraform-dir)", dir)
	}
	out := map[string]bool{}
	for _, p := range paths {
		body, err := parseHCL(p)
		if err != nil {
			return nil, err
		}
		for _, b := range body.Blocks {
			if b.Type == "variable" && len(b.Labels) == 1 {
				out[b.Labels[0]] = true
			}
		}
	}
	return out, nil
}

// setting reads vars[name].attr as a number, or def when unset.
func setting(vars map[string]cty.Value, name, attr string, def float64) float64 {
	v, ok := vars[name]
	if !ok || v.IsNull() || !(v.Type().IsObjectType() || v.Type().IsMapType()) {
		return def
	}
	if v.Type().IsObjectType() && !v.Type().HasAttribute(attr) {
		return def
	}
	if v.Type().IsMapType() && !v.HasIndex(cty.StringVal(attr)).True() {
		return def
	}
	var e cty.Value
	if v.Type().IsObjectType() {
		e = v.GetAttr(attr)
	} else {
		e = v.Index(cty.StringVal(attr))
	}
	if e.IsNull() || e.Type() != cty.Number {
		return def
	}
	f, _ := e.AsBigFloat().Float64()
	return f
}

func stringSetting(vars map[string]cty.Value, name, attr, def string) string {
	v, ok := vars[name]
	if !ok || v.IsNull() || !v.Type().IsObjectType() || !v.Type().HasAttribute(attr) {
		return def
	}
	e := v.GetAttr(attr)
	if e.IsNull() || e.Type() != cty.String {
		return def
	}
	return e.AsString()
}

func boolSetting(vars map[string]cty.Value, name, attr string, def bool) bool {
	v, ok := vars[name]
	if !ok || v.IsNull() || !v.Type().IsObjectType() || !v.Type().HasAttribute(attr) {
		return def
	}
	e := v.GetAttr(attr)
	if e.IsNull() || e.Type() != cty.Bool {
		return def
	}
	return e.True()
}

func listSetting(vars map[string]cty.Value, name, attr string) []string {
	v, ok := vars[name]
	if !ok || v.IsNull() || !v.Type().IsObjectType() || !v.Type().HasAttribute(attr) {
		return nil
	}
	e := v.GetAttr(attr)
	if e.IsNull() || !e.CanIterateElements() {
		return nil
	}
	var out []string
	for it := e.ElementIterator(); it.Next(); {
		_, x := it.Element()
		if x.Type() == cty.String && !x.IsNull() {
			out = append(out, x.AsString())
		}
	}
	return out
}

// ---- Postgres connections ------------------------------------------------

// TierDefaultConnections is Cloud SQL for PostgreSQL's default
// max_connections for an instance of memoryMB (the connection limits table
// of https://cloud.google.com/sql/docs/postgres/quotas), and whether the
// tier names its memory (db-custom-<cpus>-<MB>, db-f1-micro, db-g1-small).
func TierDefaultConnections(tier string) (int, float64, bool) {
	var mb float64
	switch {
	case tier == "db-f1-micro":
		mb = 614
	case tier == "db-g1-small":
		mb = 1740
	default:
		m := regexp.MustCompile(`^db-(?:custom|perf-optimized-N)-\d+-(\d+)$`).FindStringSubmatch(tier)
		if m == nil {
			return 0, 0, false
		}
		mb, _ = strconv.ParseFloat(m[1], 64)
	}
	gb := mb / 1024
	switch {
	case gb < 1.7:
		return 25, gb, true
	case gb < 3.75:
		return 50, gb, true
	case gb < 6:
		return 100, gb, true
	case gb < 7.5:
		return 200, gb, true
	case gb < 15:
		return 400, gb, true
	case gb < 30:
		return 500, gb, true
	case gb < 60:
		return 600, gb, true
	case gb < 120:
		return 800, gb, true
	}
	return 1000, gb, true
}

// Connections is the most connections relaybus's pools can open on each
// Cloud SQL database, as infra/terraform/database.tf computes it: pool ×
// the max instances of every service using it (a pull consumer's own
// bounds). A revision that stops receiving traffic closes its idle
// connections within pool_max_conn_idle_time (the URL's), so an old
// revision's pools are gone a minute or two after a deploy.
type Connections struct {
	PerDatabase map[string]int
	Total       int
	Limit       int // max_connections − reserved_connections
}

func connectionsOf(top *topology.Topology, vars map[string]cty.Value) Connections {
	external := map[string]bool{}
	if v, ok := vars["database_url_secrets"]; ok && !v.IsNull() && v.CanIterateElements() {
		for it := v.ElementIterator(); it.Next(); {
			k, _ := it.Element()
			external[k.AsString()] = true
		}
	}
	pool := setting(vars, "cloud_sql", "pool_max_conns", 5)
	publish := setting(vars, "publish_settings", "max_instances", 20)
	relay := setting(vars, "relay_settings", "max_instances", 3)
	dlq := setting(vars, "dlqreplay_settings", "max_instances", 2)
	consume := setting(vars, "consume_settings", "max_instances", 10)
	pullMax := setting(vars, "pull_mode", "max_instances", 1)
	pulled := pullConsumers(top, vars)
	c := Connections{PerDatabase: map[string]int{}}
	for _, d := range top.Databases {
		if external[d.Name] {
			continue
		}
		n := relay + dlq
		if d.Name == topology.MainDatabase {
			n += publish
		}
		for _, cs := range top.Consumers() {
			if cs.Database != d.Name {
				continue
			}
			if pulled[cs.Subscription()] {
				n += pullMax
			} else {
				n += consume
			}
		}
		c.PerDatabase[d.Name] = int(pool * n)
		c.Total += c.PerDatabase[d.Name]
	}
	c.Limit = int(setting(vars, "cloud_sql", "max_connections", 400) - setting(vars, "cloud_sql", "reserved_connections", 20))
	return c
}

func connections(top *topology.Topology, vars map[string]cty.Value) []Problem {
	var out []Problem
	c := connectionsOf(top, vars)
	if len(c.PerDatabase) == 0 {
		return nil
	}
	maxConns := int(setting(vars, "cloud_sql", "max_connections", 400))
	if c.Total > c.Limit {
		var parts []string
		for _, k := range sortedKeys(c.PerDatabase) {
			parts = append(parts, fmt.Sprintf("%s %d", k, c.PerDatabase[k]))
		}
		out = append(out, Problem{"connections", fmt.Sprintf("the pools can open %d Postgres connections (%s), above max_connections %d minus %d reserved",
			c.Total, strings.Join(parts, ", "), maxConns, maxConns-c.Limit),
			"lower cloud_sql.pool_max_conns or the services' max_instances, or raise cloud_sql.max_connections (and the tier)"})
	}
	tier := stringSetting(vars, "cloud_sql", "tier", "db-custom-2-7680")
	if def, gb, ok := TierDefaultConnections(tier); ok && boolSetting(vars, "cloud_sql", "create", true) && maxConns > def*2 {
		out = append(out, Problem{"connections", fmt.Sprintf("cloud_sql.max_connections %d is more than twice the %d Cloud SQL gives tier %s (%.1f GB): each connection holds memory, and that many risk running the instance out of it",
			maxConns, def, tier, gb),
			fmt.Sprintf("choose a tier with more memory, or max_connections ≤ %d with smaller pools", def*2)})
	}
	return out
}

// ---- pull mode -------------------------------------------------------------

func pullConsumers(top *topology.Topology, vars map[string]cty.Value) map[string]bool {
	out := map[string]bool{}
	if !boolSetting(vars, "pull_mode", "enabled", false) {
		return out
	}
	listed := listSetting(vars, "pull_mode", "consumers")
	for _, cs := range top.Consumers() {
		if len(listed) == 0 || contains(listed, cs.Subscription()) {
			out[cs.Subscription()] = true
		}
	}
	return out
}

func pullMode(top *topology.Topology, vars map[string]cty.Value) []Problem {
	var out []Problem
	known := map[string]bool{}
	for _, cs := range top.Consumers() {
		known[cs.Subscription()] = true
	}
	for _, n := range listSetting(vars, "pull_mode", "consumers") {
		if !known[n] {
			out = append(out, Problem{"pull-mode", fmt.Sprintf("pull_mode.consumers names %q, which is no consumer of the topology: it would stay on push", n),
				"use a subscription id <topic>.<service>-<role>: " + strings.Join(sortedKeys(known), ", ")})
		}
	}
	if boolSetting(vars, "pull_mode", "enabled", false) {
		pool := setting(vars, "cloud_sql", "pool_max_conns", 5)
		inFlight := setting(vars, "pull_mode", "max_in_flight", pool)
		if inFlight > pool {
			out = append(out, Problem{"pull-mode", fmt.Sprintf("pull_mode.max_in_flight %g is above the pool of %g connections: deliveries beyond it hold their leases while they wait for a connection", inFlight, pool),
				fmt.Sprintf("set pull_mode.max_in_flight ≤ %g, or raise cloud_sql.pool_max_conns", pool)})
		}
	}
	return out
}

// ---- schemas -----------------------------------------------------------------

func schemaRevisions(top *topology.Topology) []Problem {
	var out []Problem
	for _, tp := range top.Topics {
		n := 0
		for _, s := range tp.Schemas {
			if s.Type != "jsonschema" {
				n++
			}
		}
		if n+1 > MaxSchemaRevisions {
			out = append(out, Problem{"schemas", fmt.Sprintf("topic %s declares %d schema versions: Pub/Sub keeps at most %d revisions of a schema, and the sync needs one more while it runs", tp.Name, n, MaxSchemaRevisions),
				fmt.Sprintf("retire old versions from infra/topology.yaml once no producer sends them (at most %d)", MaxSchemaRevisions-1)})
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
