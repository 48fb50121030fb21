package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

// api are the packages a team imports (docs/architecture.md, "The
// public API"): producing, consuming, the broker and its drivers, the test
// kits and the client. functions/consume is there for the handler API a
// custom consume binary uses (RegisterHandler, Main).
var api = []string{"./shared/...", "./client/...", "./relaybustest/...", "./functions/consume"}

// exposed are the internal types the public API still names, by package:
// what a user cannot name in their own code. The list may only shrink:
// the test fails on a type that is not in it, and on one in it that the
// surface no longer names.
var exposed = map[string][]string{
	"functions/consume": {"internal/instance.ClaimCheck", "internal/instance.Database", "internal/instance.Env", "internal/instance.PubSub", "internal/instance.Recording",
		"internal/migrate.Line"},
	"shared/consumer":   {"internal/delivery.Delivery", "internal/inbox.Attempt", "internal/ledger/model.Attempt", "internal/ledger/model.Outcome"},
	"shared/outbox":     {"internal/migrate.Line"},
	"shared/projection": {"internal/migrate.Line"},
	"shared/relay":      {"internal/ledger/model.Sent", "internal/telemetry.OutboxBacklog"},
}

// The public API's exported names (functions, types, their exported
// fields and methods, variables) name internal types only where exposed
// says so, read from the compiler's export data with go/types.
func TestThePublicAPINamesOnlyTheInternalTypesItDeclares(t *testing.T) {
	pkgs := surface(t)
	if len(pkgs) < 10 {
		t.Fatalf("the public API lists %d packages: the check reads nothing", len(pkgs))
	}
	for path, names := range pkgs {
		for internal, where := range names {
			if !slices.Contains(exposed[path], internal) {
				t.Errorf("%s names the internal type %s (%s): a user cannot name it; declare it in the public API or keep it out of the signature", path, internal, where)
			}
		}
	}
	for path, internals := range exposed {
		for _, internal := range internals {
			if _, ok := pkgs[path][internal]; !ok {
				t.Errorf("%s no longer names %s: take it out of exposed", path, internal)
			}
		}
	}
}

// surface returns, for each public package (relative to the module), the
// internal types its exported names reach and the first name reaching
// each.
func surface(t *testing.T) map[string]map[string]string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-json=ImportPath,Export,Name"}, api...)...)
	cmd.Dir = repoRoot(t)
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, stderr.Bytes())
	}
	exports := map[string]string{}
	var public []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct{ ImportPath, Export, Name string }
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		exports[p.ImportPath] = p.Export
		rel := strings.TrimPrefix(p.ImportPath, module+"/")
		if p.Name != "main" && (under(rel, "shared") || under(rel, "client") || under(rel, "relaybustest") || rel == "functions/consume") {
			public = append(public, p.ImportPath)
		}
	}
	imp := importer.ForCompiler(token.NewFileSet(), "gc", func(path string) (io.ReadCloser, error) {
		f := exports[path]
		if f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	found := map[string]map[string]string{}
	for _, path := range public {
		pkg, err := imp.Import(path)
		if err != nil {
			t.Fatalf("import %s: %v", path, err)
		}
		rel := strings.TrimPrefix(path, module+"/")
		found[rel] = map[string]string{}
		w := walker{pkg: pkg, seen: map[types.Type]bool{}, found: found[rel]}
		names := pkg.Scope().Names()
		sort.Strings(names)
		for _, name := range names {
			if obj := pkg.Scope().Lookup(name); obj.Exported() {
				w.walk(name, obj.Type())
			}
		}
	}
	return found
}

// walker follows a public package's exported types to the internal
// types they name.
type walker struct {
	pkg   *types.Package
	seen  map[types.Type]bool
	found map[string]string
}

func (w walker) walk(where string, ty types.Type) {
	if w.seen[ty] {
		return
	}
	w.seen[ty] = true
	switch x := ty.(type) {
	case *types.Named:
		if p := x.Obj().Pkg(); p != nil && under(strings.TrimPrefix(p.Path(), module+"/"), "internal") && strings.HasPrefix(p.Path(), module+"/") {
			key := strings.TrimPrefix(p.Path(), module+"/") + "." + x.Obj().Name()
			if _, ok := w.found[key]; !ok {
				w.found[key] = where
			}
			return
		}
		for i := 0; i < x.TypeArgs().Len(); i++ {
			w.walk(where, x.TypeArgs().At(i))
		}
		if x.Obj().Pkg() != w.pkg { // another public package answers for its own types
			return
		}
		w.walk(where, x.Underlying())
		for i := 0; i < x.NumMethods(); i++ {
			if m := x.Method(i); m.Exported() {
				w.walk(where+"."+m.Name(), m.Type())
			}
		}
	case *types.Alias:
		w.walk(where, types.Unalias(x))
	case *types.Pointer:
		w.walk(where, x.Elem())
	case *types.Slice:
		w.walk(where, x.Elem())
	case *types.Array:
		w.walk(where, x.Elem())
	case *types.Map:
		w.walk(where, x.Key())
		w.walk(where, x.Elem())
	case *types.Chan:
		w.walk(where, x.Elem())
	case *types.Signature:
		for i := 0; i < x.Params().Len(); i++ {
			w.walk(where+" (parameter)", x.Params().At(i).Type())
		}
		for i := 0; i < x.Results().Len(); i++ {
			w.walk(where+" (result)", x.Results().At(i).Type())
		}
	case *types.Struct:
		for i := 0; i < x.NumFields(); i++ {
			if f := x.Field(i); f.Exported() {
				w.walk(where+"."+f.Name(), f.Type())
			}
		}
	case *types.Interface:
		for i := 0; i < x.NumMethods(); i++ {
			w.walk(where+"."+x.Method(i).Name(), x.Method(i).Type())
		}
	}
}
