package doccheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocsNameOnlyWhatExists: every repository path, make target,
// environment variable and link that README.md and docs/**/*.md name
// exists, and no doc links outside the repository or cites a design
// document the repository does not hold.
func TestDocsNameOnlyWhatExists(t *testing.T) {
	root := filepath.Join("..", "..")
	repo, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	files, err := Files(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("found %d docs (%v): docs/ is missing or the walk is wrong", len(files), files)
	}
	for _, f := range files {
		ps, err := repo.Check(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			t.Error(p)
		}
	}
}

// TestCheckFindsWhatIsMissing runs the checks on a small repository of its
// own: each line names one thing, and the check reports it exactly when it
// does not exist.
func TestCheckFindsWhatIsMissing(t *testing.T) {
	root := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("Makefile", ".PHONY: dev test\nGO ?= go\ndev:\n\techo dev\ntest: lint\n\techo test\n")
	write("shared/event/event.go", "package event\n\n// Event is one.\ntype Event struct{}\n\nfunc (Event) Method() {}\n\nfunc Decode() {}\n\nconst (\n\tMaxSize = 1\n)\n")
	write("shared/config.go", "package shared\n\ntype C struct {\n\tBudget string `env:\"LEDGER_BUDGET, default=10s\"`\n}\n\nvar _ = \"DATABASE_URL_\" + \"x\"\nvar _ = \"TRANSPORT\"\n")
	write("infra/main.tf", "variable \"x\" {}\n")
	write("docs/other.md", "# Other page\n\n## A section, with `code`\n")
	write("docs/console/shot.png", "\x89PNG\x00")

	cases := []struct {
		name, line string
		want       string // a substring of the one problem; "" for none
	}{
		{"existing path", "see `shared/event/event.go`", ""},
		{"existing dir, ./ and /...", "run `go test ./shared/...` over `./shared/event`", ""},
		{"module path", "import `github.com/relaybus/relaybus/shared/event`", ""},
		{"missing path", "see `shared/evnt/event.go`", "shared/evnt/event.go does not exist"},
		{"missing file in a code block", "```sh\ngo run ./shared/cmd/nothing\n```", "./shared/cmd/nothing does not exist"},
		{"code block prose is not a path", "```\noutput from /tmp/x and shared/nothing\n```", ""},
		{"placeholder", "each `functions/<name>/cmd/main.go`", ""},
		{"glob that matches", "`infra/*.tf`", ""},
		{"glob that matches nothing", "`infra/*.hcl`", "matches nothing"},
		{"line suffix", "`shared/config.go:4`", ""},
		{"declaration", "`shared/event.Event` and `shared/event.Event.Method` and `shared/event.MaxSize`", ""},
		{"missing declaration", "`shared/event.Encode`", "declares no Encode"},
		{"declaration in a missing package", "`shared/nothing.Event`", "no package shared/nothing"},
		{"not a repository path", "`testdata/fuzz` and `hashicorp/terraform#1` and `.state/dev.json`", ""},
		{"make target", "run `make dev`, then `make test`", ""},
		{"missing make target", "run `make deploy`", "make deploy: the Makefile has no such target"},
		{"missing make target in a code block", "```sh\nmake demo   # in another terminal\n```", "make demo"},
		{"variable", "set `LEDGER_BUDGET` or `$LEDGER_BUDGET`", ""},
		{"variable with a value", "`TRANSPORT=nats`", ""},
		{"missing variable", "set `LEDGER_BUDGT`", "variable LEDGER_BUDGT appears nowhere"},
		{"missing variable with a value", "`TRANSPRT=nats`", "variable TRANSPRT"},
		{"prefix variable", "`DATABASE_URL_<NAME>`", ""},
		{"missing prefix variable", "`DATABASE_DSN_<NAME>`", "prefix DATABASE_DSN_"},
		{"external variable", "`OTEL_EXPORTER_OTLP_ENDPOINT` and `OTEL_*`", ""},
		{"a status is not a variable", "`CONSUMED` and `FAILED`", ""},
		{"relative link", "[other](other.md) and ![shot](console/shot.png)", ""},
		{"link with anchor", "[a section](other.md#a-section-with-code)", ""},
		{"missing link", "[gone](deploying.md)", "docs/deploying.md does not exist"},
		{"missing anchor", "[x](other.md#nowhere)", "no such heading"},
		{"anchor in the same page", "[top](#the-page)", ""},
		{"link leaving the repository", "[design](../../shared/seeds.txt)", "leaves the repository"},
		{"file link", "[x](file:///etc/passwd)", "leaves the repository"},
		{"absolute link", "[x](/etc/passwd)", "leaves the repository"},
		{"web link", "[Pub/Sub](https://cloud.google.com/pubsub/docs/push)", ""},
		{"design document", "as `pubsub-conventions.md` §6 says", "document outside the repository"},
	}
	repo, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			write("docs/page.md", "# The page\n\n"+c.line+"\n")
			ps, err := repo.Check("docs/page.md")
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.want == "" && len(ps) > 0:
				t.Errorf("%q: want no problem, got %v", c.line, ps)
			case c.want != "" && len(ps) != 1:
				t.Errorf("%q: want one problem with %q, got %v", c.line, c.want, ps)
			case c.want != "" && !strings.Contains(ps[0].Msg, c.want):
				t.Errorf("%q: want a problem with %q, got %v", c.line, c.want, ps[0])
			}
		})
	}
}

func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Behind a transaction-mode pooler (PgBouncer, Supabase)": "behind-a-transaction-mode-pooler-pgbouncer-supabase",
		"Load: `make load`":                   "load-make-load",
		"Strict handlers and the resequencer": "strict-handlers-and-the-resequencer",
		"Ledger levels & cost":                "ledger-levels--cost",
	} {
		if got := Slug(h); got != want {
			t.Errorf("Slug(%q) = %q, want %q", h, got, want)
		}
	}
}
