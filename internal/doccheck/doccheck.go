// Package doccheck checks that the repository's Markdown docs (README.md and
// docs/**/*.md) name only what exists, so a reader who copies a path, a make
// target, a variable or a link from them finds it.
//
// What a doc names, and how each is checked:
//
//   - Repository paths. In inline code, every whitespace-separated token
//     whose first path segment is a top-level entry of the repository
//     (functions/..., shared/..., infra/..., docs/..., Makefile, ...), with
//     an optional leading ./ or github.com/relaybus/relaybus/ prefix; in code
//     blocks, every token that starts with ./. It must exist. A trailing
//     /..., a :line suffix and a #anchor are ignored; a token with a
//     placeholder (<name>, {id}, $VAR, …) is not checked; a token with * is
//     a glob and must match something. A token of the form dir/pkg.Name
//     (shared/event.Event, internal/ledger/model.Derive) names a Go
//     declaration: dir/pkg must be a package of the repository and Name one
//     of its top-level declarations (for Type.Method, the type).
//   - Make targets. "make <target>" in inline code or a code block: the
//     target must be a rule of the Makefile.
//   - Environment variables. An inline code span that is one UPPER_SNAKE_CASE
//     word with at least one underscore (LEDGER_BUDGET, $DATABASE_URL), or
//     any upper-case word followed by = (TRANSPORT=nats), is a variable. It
//     must occur as a whole word in a file of the repository that is not
//     Markdown (the code's env tags and Getenv calls, Terraform, the
//     Makefile, .ci/run, cloudbuild.yaml). A name ending in _<NAME> or _*
//     (DATABASE_URL_<NAME>, OTEL_*) is a prefix that must occur. Variables
//     other projects define and document (OpenTelemetry's OTEL_*, Cloud
//     Run's and the buildpacks') are in External.
//   - Links. A Markdown link or image target is either an http(s) URL, or a
//     path relative to the doc that stays inside the repository and exists;
//     a #fragment must be a heading of the target doc (GitHub's anchors).
//     Any other scheme (file:, ...) and absolute paths are refused.
//   - Design documents outside the repository. The docs state the design in
//     their own words: a doc that names one of DesignDocuments is refused.
//
// Words in ordinary prose are not checked: only what is marked as code or
// as a link.
package doccheck

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// External lists the variables the docs may name that the repository does
// not define: names, or prefixes ending in _ (OTEL_ covers every
// OpenTelemetry SDK variable).
var External = []string{
	"OTEL_",            // the OpenTelemetry SDK's variables, defined by its specification
	"GOOGLE_BUILDABLE", // Google Cloud's buildpacks: the package to build
}

// DesignDocuments are documents outside the repository that a doc must not
// cite: a reader of the repository has none of them.
var DesignDocuments = []string{
	"seeds/",
	"ARCHITECTURE.md",
	"BENCH.md",
	"pubsub-conventions",
	"event-ledger-design",
	"aggregate-id-extraction",
	"messaging-sdk-spec",
	"outbox-streamingpull",
	"design card",
	"the seeds",
	"seeds'",
	"seed's",
}

// Problem is one thing a doc names that does not exist.
type Problem struct {
	File string // relative to the repository root
	Line int
	Msg  string
}

func (p Problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg) }

// skipped are top-level entries that are not the repository's: local state
// and build output.
var skipped = map[string]bool{".git": true, ".state": true, "bin": true, ".scratch": true}

// Repo is what the docs are checked against.
type Repo struct {
	root    string
	top     map[string]bool // top-level entries
	targets map[string]bool // Makefile rules
	words   map[string]bool // upper-case words of the non-Markdown files
	text    []byte          // the non-Markdown files, for prefixes
	decls   map[string]map[string]bool
}

// Open reads the repository at root: its top-level entries, the Makefile's
// rules and the words of its non-Markdown files.
func Open(root string) (*Repo, error) {
	r := &Repo{root: root, top: map[string]bool{}, targets: map[string]bool{}, words: map[string]bool{}, decls: map[string]map[string]bool{}}
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("doccheck: %w", err)
	}
	for _, e := range entries {
		if !skipped[e.Name()] {
			r.top[e.Name()] = true
		}
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		return nil, fmt.Errorf("doccheck: %w", err)
	}
	for _, m := range regexp.MustCompile(`(?m)^([A-Za-z0-9_][A-Za-z0-9_.-]*)\s*:([^=]|$)`).FindAllSubmatch(mk, -1) {
		r.targets[string(m[1])] = true
	}
	var buf bytes.Buffer
	upper := regexp.MustCompile(`[A-Z][A-Z0-9_]*`)
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if skipped[rel] || d.Name() == "node_modules" || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(b, 0) >= 0 { // binary: images, binaries
			return nil
		}
		for _, w := range upper.FindAll(b, -1) {
			r.words[string(w)] = true
		}
		buf.Write(b)
		buf.WriteByte('\n')
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("doccheck: %w", err)
	}
	r.text = buf.Bytes()
	return r, nil
}

// Files returns README.md and every Markdown file under docs/, relative to
// root, sorted.
func Files(root string) ([]string, error) {
	out := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, _ := filepath.Rel(root, path)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("doccheck: %w", err)
	}
	sort.Strings(out[1:])
	return out, nil
}

var (
	fence     = regexp.MustCompile("^\\s*(```|~~~)")
	codeSpan  = regexp.MustCompile("`([^`]+)`")
	link      = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	heading   = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	makeCmd   = regexp.MustCompile(`(?:^|[\s;&|(])make\s+([a-z][a-z0-9_-]*)`)
	variable  = regexp.MustCompile(`^\$?\{?([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*)\}?(=.*)?$`)
	prefixVar = regexp.MustCompile(`^\$?([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_)(?:<[A-Za-z]+>|\*)$`)
	scheme    = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	goDecl    = regexp.MustCompile(`^(.+)/([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\.[A-Za-z0-9_]+)*$`)
)

// Check returns what the doc at file (relative to the root) names that does
// not exist.
func (r *Repo) Check(file string) ([]Problem, error) {
	b, err := os.ReadFile(filepath.Join(r.root, file))
	if err != nil {
		return nil, fmt.Errorf("doccheck: %w", err)
	}
	var out []Problem
	add := func(line int, format string, a ...any) {
		out = append(out, Problem{File: file, Line: line, Msg: fmt.Sprintf(format, a...)})
	}
	inCode := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		for _, d := range DesignDocuments {
			if strings.Contains(line, d) {
				add(n, "cites %q, a document outside the repository: state the design in the docs' own words", d)
			}
		}
		if fence.MatchString(line) {
			inCode = !inCode
			continue
		}
		if inCode {
			for _, m := range makeCmd.FindAllStringSubmatch(line, -1) {
				r.checkTarget(n, m[1], add)
			}
			for _, tok := range strings.Fields(line) {
				tok = strings.Trim(tok, "\"'(),;")
				if strings.HasPrefix(tok, "./") {
					r.checkPath(n, tok, add)
				}
			}
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			r.checkSpan(n, strings.TrimSpace(m[1]), add)
		}
		for _, m := range link.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, "``"), -1) {
			r.checkLink(n, file, m[1], add)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("doccheck: %s: %w", file, err)
	}
	return out, nil
}

type adder func(line int, format string, a ...any)

func (r *Repo) checkSpan(n int, s string, add adder) {
	if m := prefixVar.FindStringSubmatch(s); m != nil {
		if !r.external(m[1]) && !bytes.Contains(r.text, []byte(m[1])) {
			add(n, "variable prefix %s appears nowhere in the code, Terraform or the Makefile", m[1])
		}
		return
	}
	if m := variable.FindStringSubmatch(s); m != nil && (strings.Contains(m[1], "_") || m[2] != "") {
		if !r.external(m[1]) && !r.words[m[1]] {
			add(n, "variable %s appears nowhere in the code, Terraform or the Makefile", m[1])
		}
		return
	}
	for _, mm := range makeCmd.FindAllStringSubmatch(s, -1) {
		r.checkTarget(n, mm[1], add)
	}
	for _, tok := range strings.Fields(s) {
		tok = strings.Trim(tok, "\"'(),;")
		tok = strings.TrimPrefix(tok, "github.com/relaybus/relaybus/")
		first, _, _ := strings.Cut(strings.TrimPrefix(tok, "./"), "/")
		if r.top[first] && (strings.Contains(tok, "/") || tok == first) {
			r.checkPath(n, tok, add)
		}
	}
}

func (r *Repo) external(name string) bool {
	for _, e := range External {
		if name == e || (strings.HasSuffix(e, "_") && strings.HasPrefix(name, e)) {
			return true
		}
	}
	return false
}

func (r *Repo) checkTarget(n int, target string, add adder) {
	if !r.targets[target] {
		add(n, "make %s: the Makefile has no such target", target)
	}
}

// checkPath checks a path token relative to the repository root.
func (r *Repo) checkPath(n int, tok string, add adder) {
	p := strings.TrimPrefix(tok, "./")
	if strings.ContainsAny(p, "<>{}$…") || strings.Contains(p, "..") && !strings.HasSuffix(p, "/...") {
		return // a placeholder, or a parent directory
	}
	p = strings.TrimSuffix(p, "/...")
	if p == "..." || p == "" {
		return
	}
	if i := strings.IndexByte(p, '#'); i >= 0 {
		p = p[:i]
	}
	if m := regexp.MustCompile(`:\d+(-\d+)?$`).FindStringIndex(p); m != nil {
		p = p[:m[0]]
	}
	p = strings.TrimRight(p, "/.:")
	if strings.Contains(p, "*") {
		if ms, _ := filepath.Glob(filepath.Join(r.root, p)); len(ms) == 0 {
			add(n, "%s matches nothing in the repository", tok)
		}
		return
	}
	if _, err := os.Stat(filepath.Join(r.root, p)); err == nil {
		return
	}
	if m := goDecl.FindStringSubmatch(p); m != nil {
		dir := m[1] + "/" + m[2]
		decls, ok := r.packageDecls(dir)
		switch {
		case !ok:
			add(n, "%s: no package %s in the repository", tok, dir)
		case !decls[m[3]]:
			add(n, "%s: package %s declares no %s", tok, dir, m[3])
		}
		return
	}
	add(n, "%s does not exist in the repository", tok)
}

// packageDecls returns the top-level names the Go files of dir declare
// (tests excluded), and whether dir holds any.
func (r *Repo) packageDecls(dir string) (map[string]bool, bool) {
	if d, ok := r.decls[dir]; ok {
		return d, d != nil
	}
	entries, err := os.ReadDir(filepath.Join(r.root, dir))
	if err != nil {
		r.decls[dir] = nil
		return nil, false
	}
	fset := token.NewFileSet()
	names := map[string]bool{}
	parsed := 0
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(r.root, dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			continue
		}
		parsed++
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					names[d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						names[s.Name.Name] = true
					case *ast.ValueSpec:
						for _, id := range s.Names {
							names[id.Name] = true
						}
					}
				}
			}
		}
	}
	if parsed == 0 {
		r.decls[dir] = nil
		return nil, false
	}
	r.decls[dir] = names
	return names, true
}

func (r *Repo) checkLink(n int, file, target string, add adder) {
	switch {
	case strings.HasPrefix(target, "http://"), strings.HasPrefix(target, "https://"):
		return
	case strings.HasPrefix(target, "#"):
		r.checkAnchor(n, file, target[1:], add)
		return
	case scheme.MatchString(target), strings.HasPrefix(target, "/"):
		add(n, "link %s leaves the repository: link a file of the repository or an http(s) URL", target)
		return
	}
	path, frag, _ := strings.Cut(target, "#")
	rel := filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
	if rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		add(n, "link %s leaves the repository", target)
		return
	}
	if _, err := os.Stat(filepath.Join(r.root, rel)); err != nil {
		add(n, "link %s: %s does not exist", target, filepath.ToSlash(rel))
		return
	}
	if frag != "" && strings.HasSuffix(rel, ".md") {
		r.checkAnchor(n, filepath.ToSlash(rel), frag, add)
	}
}

func (r *Repo) checkAnchor(n int, file, frag string, add adder) {
	anchors, err := r.anchors(file)
	if err != nil {
		add(n, "link #%s: %v", frag, err)
		return
	}
	if !anchors[frag] {
		add(n, "link %s#%s: no such heading", file, frag)
	}
}

// anchors returns the anchors GitHub gives the headings of a Markdown file.
func (r *Repo) anchors(file string) (map[string]bool, error) {
	b, err := os.ReadFile(filepath.Join(r.root, file))
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	seen := map[string]int{}
	inCode := false
	for _, line := range strings.Split(string(b), "\n") {
		if fence.MatchString(line) {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			s := Slug(m[2])
			if k := seen[s]; k > 0 {
				out[fmt.Sprintf("%s-%d", s, k)] = true
			} else {
				out[s] = true
			}
			seen[s]++
		}
	}
	return out, nil
}

// Slug is the anchor GitHub gives a heading: lower case, letters, digits,
// spaces, hyphens and underscores kept, spaces made hyphens.
func Slug(h string) string {
	var sb strings.Builder
	for _, c := range strings.ToLower(h) {
		switch {
		case c == ' ':
			sb.WriteByte('-')
		case c == '-' || c == '_' || unicode.IsLetter(c) || unicode.IsDigit(c):
			sb.WriteRune(c)
		}
	}
	return sb.String()
}
