package doccheck_test

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/relaybus/relaybus/internal/doccheck"
)

// envDefault is what the configuration structs say of a variable.
type envDefault struct {
	defaults []string // each struct's default= (a variable may be read by several)
}

// envTags reads every go-envconfig tag (`env:"NAME, default=X"`) of the
// non-test Go files under dirs.
func envTags(t *testing.T, root string, dirs ...string) map[string]*envDefault {
	t.Helper()
	vars := map[string]*envDefault{}
	fset := token.NewFileSet()
	for _, dir := range dirs {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				field, ok := n.(*ast.Field)
				if !ok || field.Tag == nil {
					return true
				}
				tag, err := strconv.Unquote(field.Tag.Value)
				if err != nil {
					return true
				}
				env, ok := reflect.StructTag(tag).Lookup("env")
				if !ok {
					return true
				}
				parts := strings.Split(env, ",")
				name := strings.TrimSpace(parts[0])
				if name == "" {
					return true
				}
				v := vars[name]
				if v == nil {
					v = &envDefault{}
					vars[name] = v
				}
				for i, p := range parts[1:] {
					p = strings.TrimSpace(p)
					if strings.HasPrefix(p, "default=") {
						// A default may itself hold commas: the rest of the tag.
						d := strings.TrimPrefix(strings.TrimSpace(strings.Join(parts[1+i:], ",")), "default=")
						if !slices.Contains(v.defaults, d) {
							v.defaults = append(v.defaults, d)
						}
						return true
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return vars
}

var (
	backticked = regexp.MustCompile("`([^`]*)`")
	envName    = regexp.MustCompile(`^[A-Z][A-Z0-9_]{2,}$`)
)

// A default the docs' configuration tables state (a row's "default"
// column) is the one the configuration struct's tag gives the variable,
// so a default changed in the code and not in the docs fails here.
func TestTheDocsDefaultsAreTheTags(t *testing.T) {
	root := filepath.Join("..", "..")
	vars := envTags(t, root, "functions", "internal", "shared", "cmd")
	files, err := doccheck.Files(root)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, file := range files {
		f, err := os.Open(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		varCol, defCol := -1, -1
		for line := 1; sc.Scan(); line++ {
			row := strings.TrimSpace(sc.Text())
			if !strings.HasPrefix(row, "|") {
				varCol, defCol = -1, -1
				continue
			}
			cells := strings.Split(strings.Trim(row, "|"), "|")
			for i := range cells {
				cells[i] = strings.TrimSpace(cells[i])
			}
			if slices.Contains(cells, "variable") && slices.Contains(cells, "default") {
				varCol, defCol = slices.Index(cells, "variable"), slices.Index(cells, "default")
				continue
			}
			if varCol < 0 || len(cells) <= max(varCol, defCol) {
				continue
			}
			var names []string
			for _, m := range backticked.FindAllStringSubmatch(cells[varCol], -1) {
				if envName.MatchString(m[1]) {
					names = append(names, m[1])
				}
			}
			stated := map[string]string{} // variable -> the default the row states
			tokens := backticked.FindAllStringSubmatch(cells[defCol], -1)
			switch {
			case len(names) == 1 && len(tokens) == 1:
				stated[names[0]] = tokens[0][1]
			case len(names) > 1: // `A` `x`, `B` `y`
				for i := 0; i+1 < len(tokens); i++ {
					if slices.Contains(names, tokens[i][1]) {
						stated[tokens[i][1]] = tokens[i+1][1]
						i++
					}
				}
			}
			for name, d := range stated {
				v := vars[name]
				if v == nil || len(v.defaults) == 0 {
					continue // not a tagged default (a constant, or another program's variable)
				}
				checked++
				if !slices.Contains(v.defaults, d) {
					t.Errorf("%s:%d: %s's default is `%s` here, %q in its configuration struct's tag", file, line, name, d, v.defaults)
				}
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if checked < 15 {
		t.Errorf("checked %d defaults in the docs' tables: the check reads too little", checked)
	}
	t.Logf("%d defaults checked", checked)
}
