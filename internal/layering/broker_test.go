package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestBrokerDriversLinkNeitherTheOther: the Pub/Sub and NATS drivers
// stand beside each other, so a binary that uses one links none of the
// other's client.
func TestBrokerDriversLinkNeitherTheOther(t *testing.T) {
	for _, tc := range []struct {
		pkg  string
		deny []rule
	}{
		{"./shared/broker/pubsub", []rule{prefix(module + "/shared/broker/nats"), prefix("github.com/nats-io")}},
		{"./shared/broker/nats", []rule{prefix(module + "/shared/broker/pubsub"), prefix("cloud.google.com/go/pubsub")}},
		// The contract itself links no driver at all.
		{"./shared/broker", []rule{prefix(module + "/shared/broker/pubsub"), prefix(module + "/shared/broker/nats"),
			prefix("cloud.google.com/go/pubsub"), prefix("github.com/nats-io"), prefix("google.golang.org/grpc")}},
	} {
		t.Run(path.Base(tc.pkg), func(t *testing.T) {
			g := load(t, tc.pkg)
			for _, r := range tc.deny {
				if chain := g.find(func(p listed) bool { return r.match(p.ImportPath) }); chain != nil {
					t.Errorf("%s links %s: %s", tc.pkg, r.name, strings.Join(chain, " -> "))
				}
			}
		})
	}
}

// brokerCore are the methods of the broker contract (shared/broker's
// Broker) that no single-purpose interface needs more than one of.
var brokerCore = []string{"Publish", "PublishBatch", "Pull", "Provision"}

// TestTheBrokerInterfaceIsDeclaredOnce: the union of the broker's methods
// is shared/broker.Broker alone. An interface anywhere else in the module
// (tests included) whose method set, embedded interfaces resolved, holds
// two or more of Publish, PublishBatch, Pull and Provision is a second
// declaration of the contract: use broker.Broker, or the one method the
// code needs.
func TestTheBrokerInterfaceIsDeclaredOnce(t *testing.T) {
	ifaces, err := moduleInterfaces(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(ifaces) < 20 {
		t.Fatalf("found %d interfaces in the module: the walk is broken", len(ifaces))
	}
	owner := module + "/shared/broker"
	if got := ifaces[owner+".Broker"].methods(ifaces, 0); len(intersect(got, brokerCore)) != len(brokerCore) {
		t.Fatalf("shared/broker.Broker has methods %v, want all of %v: the check below would see nothing", got, brokerCore)
	}
	for name, it := range ifaces {
		if strings.HasPrefix(name, owner+".") {
			continue
		}
		if core := intersect(it.methods(ifaces, 0), brokerCore); len(core) >= 2 {
			t.Errorf("%s (%s) declares %v of the broker's methods: use broker.Broker (shared/broker) or the one method it needs", name, it.pos, core)
		}
	}
}

func intersect(a, b []string) []string {
	var out []string
	for _, s := range a {
		if slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}

// iface is an interface type declared in the module: its own methods and
// the qualified names (import path "." name) of what it embeds.
type iface struct {
	pos      string
	own      []string
	embedded []string
}

// methods is it's method set, embedded interfaces of the module resolved
// (others, from the standard library or third parties, add nothing).
func (it iface) methods(all map[string]iface, depth int) []string {
	out := slices.Clone(it.own)
	if depth > 10 {
		return out
	}
	for _, e := range it.embedded {
		if sub, ok := all[e]; ok {
			out = append(out, sub.methods(all, depth+1)...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// moduleInterfaces parses every Go file of the module and returns its
// named interface types by import path "." name.
func moduleInterfaces(root string) (map[string]iface, error) {
	out := map[string]iface{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "node_modules" || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		pkg := module + "/" + filepath.ToSlash(rel)
		imports := map[string]string{}
		for _, im := range f.Imports {
			ip, _ := strconv.Unquote(im.Path.Value)
			local := path.Base(ip)
			if im.Name != nil {
				local = im.Name.Name
			}
			imports[local] = ip
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				d := iface{pos: fset.Position(ts.Pos()).String()}
				// qualified names a type expression that names a type.
				qualified := func(x ast.Expr) string {
					switch e := x.(type) {
					case *ast.Ident:
						return pkg + "." + e.Name
					case *ast.SelectorExpr:
						if x, ok := e.X.(*ast.Ident); ok && imports[x.Name] != "" {
							return imports[x.Name] + "." + e.Sel.Name
						}
					}
					return ""
				}
				it, ok := ts.Type.(*ast.InterfaceType)
				if !ok {
					// An alias of an interface (pull.Source = broker.Puller)
					// has its methods.
					if q := qualified(ts.Type); ts.Assign.IsValid() && q != "" {
						d.embedded = []string{q}
						out[pkg+"."+ts.Name.Name] = d
					}
					continue
				}
				for _, m := range it.Methods.List {
					if len(m.Names) > 0 {
						for _, n := range m.Names {
							d.own = append(d.own, n.Name)
						}
						continue
					}
					if q := qualified(m.Type); q != "" {
						d.embedded = append(d.embedded, q)
					}
				}
				out[pkg+"."+ts.Name.Name] = d
			}
		}
		return nil
	})
	return out, err
}
