package infra

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/tryfunc"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	ctyyaml "github.com/zclconf/go-cty-yaml"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
	ctyjson "github.com/zclconf/go-cty/cty/json"
)

// repoRoot is the repository root (this file is in infra/).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot find the test's source file")
	}
	return filepath.Dir(filepath.Dir(file))
}

// tfConfig is the parsed Terraform configuration of one directory.
type tfConfig struct {
	dir       string
	files     map[string]*hclsyntax.Body
	src       map[string][]byte
	locals    map[string]*hclsyntax.Attribute
	variables map[string]*hclsyntax.Block
	resources map[string]*hclsyntax.Block // "type.name"
}

// loadTerraform parses every .tf file in dir; a syntax error fails the test.
func loadTerraform(t testing.TB, dir string) *tfConfig {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "*.tf"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no .tf files in %s (%v)", dir, err)
	}
	c := &tfConfig{dir: dir, files: map[string]*hclsyntax.Body{}, src: map[string][]byte{},
		locals: map[string]*hclsyntax.Attribute{}, variables: map[string]*hclsyntax.Block{}, resources: map[string]*hclsyntax.Block{}}
	p := hclparse.NewParser()
	for _, path := range paths {
		f, diags := p.ParseHCLFile(path)
		if diags.HasErrors() {
			t.Fatalf("parse %s: %s", path, diags.Error())
		}
		body := f.Body.(*hclsyntax.Body)
		name := filepath.Base(path)
		c.files[name], c.src[name] = body, f.Bytes
		for _, b := range body.Blocks {
			switch b.Type {
			case "locals":
				for n, a := range b.Body.Attributes {
					if _, dup := c.locals[n]; dup {
						t.Fatalf("local.%s declared twice", n)
					}
					c.locals[n] = a
				}
			case "variable":
				c.variables[b.Labels[0]] = b
			case "resource":
				key := b.Labels[0] + "." + b.Labels[1]
				if _, dup := c.resources[key]; dup {
					t.Fatalf("resource %s declared twice", key)
				}
				c.resources[key] = b
			}
		}
	}
	return c
}

// resource returns a resource block or fails.
func (c *tfConfig) resource(t testing.TB, key string) *hclsyntax.Block {
	t.Helper()
	b, ok := c.resources[key]
	if !ok {
		t.Fatalf("resource %s is not declared", key)
	}
	return b
}

// resourcesOfType returns the names of every resource of a type, sorted.
func (c *tfConfig) resourcesOfType(typ string) []string {
	var out []string
	for k := range c.resources {
		if strings.HasPrefix(k, typ+".") {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// exprSource is an expression's source text.
func (c *tfConfig) exprSource(e hclsyntax.Expression) string {
	r := e.Range()
	for name, src := range c.src {
		if filepath.Base(r.Filename) == name {
			return string(r.SliceBytes(src))
		}
	}
	return ""
}

// evaluator evaluates locals and expressions of a configuration the way
// Terraform does, for the functions the configuration's locals use.
type evaluator struct {
	t      testing.TB
	c      *tfConfig
	vars   map[string]cty.Value
	locals map[string]cty.Value
	busy   map[string]bool
	funcs  map[string]function.Function
	// stubs stand in for resources and data sources (withStubs), so locals
	// that refer to them can be evaluated too.
	stubs map[string]cty.Value
}

// withStubs makes the resource stand-ins of resourceStubs visible to every
// local evaluated from now on.
func (ev *evaluator) withStubs() *evaluator {
	ev.t.Helper()
	ev.stubs = resourceStubs(ev.t, ev)
	return ev
}

// newEvaluator evaluates variables from their defaults (with optional()
// attribute defaults applied, as Terraform does) and the given values, which
// must include every variable without a default that an evaluated expression uses.
func (c *tfConfig) newEvaluator(t testing.TB, given map[string]cty.Value) *evaluator {
	t.Helper()
	ev := &evaluator{t: t, c: c, vars: map[string]cty.Value{}, locals: map[string]cty.Value{}, busy: map[string]bool{}, funcs: terraformFunctions(c.dir)}
	for name, b := range c.variables {
		ty := cty.DynamicPseudoType
		var defaults *typeexpr.Defaults
		if a, ok := b.Body.Attributes["type"]; ok {
			var diags hcl.Diagnostics
			ty, defaults, diags = typeexpr.TypeConstraintWithDefaults(a.Expr)
			if diags.HasErrors() {
				t.Fatalf("variable %s type: %s", name, diags.Error())
			}
		}
		v, ok := given[name]
		if !ok {
			a, has := b.Body.Attributes["default"]
			if !has {
				continue
			}
			var diags hcl.Diagnostics
			v, diags = a.Expr.Value(nil)
			if diags.HasErrors() {
				t.Fatalf("variable %s default: %s", name, diags.Error())
			}
		}
		if defaults != nil && !v.IsNull() {
			v = defaults.Apply(v)
		}
		cv, err := convert.Convert(v, ty)
		if err != nil {
			t.Fatalf("variable %s: value does not fit its type: %v", name, err)
		}
		ev.vars[name] = cv
	}
	return ev
}

// ctx is the evaluation context of expr: var, path, local (the locals expr
// refers to, evaluated first) and the given extra variables.
func (ev *evaluator) ctx(expr hcl.Expression, extra map[string]cty.Value) *hcl.EvalContext {
	ev.t.Helper()
	locals := map[string]cty.Value{}
	for _, tr := range expr.Variables() {
		if tr.RootName() != "local" || len(tr) < 2 {
			continue
		}
		if a, ok := tr[1].(hcl.TraverseAttr); ok {
			locals[a.Name] = ev.local(a.Name)
		}
	}
	vars := map[string]cty.Value{
		"var":   cty.ObjectVal(ev.vars),
		"path":  cty.ObjectVal(map[string]cty.Value{"module": cty.StringVal(ev.c.dir)}),
		"local": cty.ObjectVal(locals),
	}
	for k, v := range ev.stubs {
		vars[k] = v
	}
	for k, v := range extra {
		vars[k] = v
	}
	return &hcl.EvalContext{Variables: vars, Functions: ev.funcs}
}

// local evaluates local.name (and what it depends on) once.
func (ev *evaluator) local(name string) cty.Value {
	ev.t.Helper()
	if v, ok := ev.locals[name]; ok {
		return v
	}
	a, ok := ev.c.locals[name]
	if !ok {
		ev.t.Fatalf("local.%s is not declared", name)
	}
	if ev.busy[name] {
		ev.t.Fatalf("local.%s depends on itself", name)
	}
	ev.busy[name] = true
	v, diags := a.Expr.Value(ev.ctx(a.Expr, nil))
	if diags.HasErrors() {
		ev.t.Fatalf("local.%s: %s", name, diags.Error())
	}
	ev.locals[name] = v
	return v
}

// eval evaluates an expression with extra variables (each, stand-ins for resources).
func (ev *evaluator) eval(expr hcl.Expression, extra map[string]cty.Value) (cty.Value, hcl.Diagnostics) {
	return expr.Value(ev.ctx(expr, extra))
}

// jsonValue turns a cty value into plain Go values (via JSON), for comparisons.
func jsonValue(t testing.TB, v cty.Value) any {
	t.Helper()
	b, err := ctyjson.Marshal(v, v.Type())
	if err != nil {
		t.Fatalf("marshal %#v: %v", v, err)
	}
	var out any
	if err := jsonUnmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// terraformFunctions are the Terraform functions the checked expressions
// use, from the same implementations Terraform 1.5 registers
// (internal/lang/functions.go): cty's stdlib, hcl's tryfunc, go-cty-yaml;
// coalesce, sha1, file, tostring, tonumber, toset, alltrue, anytrue, sum and
// urlencode follow Terraform's own implementations.
func terraformFunctions(baseDir string) map[string]function.Function {
	return map[string]function.Function{
		"alltrue":    allTrueFunc,
		"anytrue":    anyTrueFunc,
		"can":        tryfunc.CanFunc,
		"coalesce":   coalesceFunc,
		"concat":     stdlib.ConcatFunc,
		"contains":   stdlib.ContainsFunc,
		"dirname":    dirnameFunc,
		"element":    stdlib.ElementFunc,
		"file":       fileFunc(baseDir),
		"flatten":    stdlib.FlattenFunc,
		"floor":      stdlib.FloorFunc,
		"format":     stdlib.FormatFunc,
		"join":       stdlib.JoinFunc,
		"jsonencode": stdlib.JSONEncodeFunc,
		"keys":       stdlib.KeysFunc,
		"length":     lengthFunc,
		"lookup":     stdlib.LookupFunc,
		"lower":      stdlib.LowerFunc,
		"max":        stdlib.MaxFunc,
		"merge":      stdlib.MergeFunc,
		"min":        stdlib.MinFunc,
		"regex":      stdlib.RegexFunc,
		"regexall":   stdlib.RegexAllFunc,
		"replace":    stdlib.ReplaceFunc,
		"sha1":       sha1Func,
		"sort":       stdlib.SortFunc,
		"split":      stdlib.SplitFunc,
		"substr":     stdlib.SubstrFunc,
		"sum":        sumFunc,
		"tonumber":   toFunc(cty.Number),
		"tostring":   toFunc(cty.String),
		"toset":      toFunc(cty.Set(cty.DynamicPseudoType)),
		"trimsuffix": stdlib.TrimSuffixFunc,
		"try":        tryfunc.TryFunc,
		"upper":      stdlib.UpperFunc,
		"urlencode":  urlEncodeFunc,
		"values":     stdlib.ValuesFunc,
		"yamldecode": ctyyaml.YAMLDecodeFunc,
	}
}

// dirnameFunc is Terraform's dirname: a path without its last element.
var dirnameFunc = function.New(&function.Spec{
	Params: []function.Parameter{{Name: "path", Type: cty.String}},
	Type:   function.StaticReturnType(cty.String),
	Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
		return cty.StringVal(filepath.Dir(args[0].AsString())), nil
	},
})

// coalesceFunc is Terraform's coalesce: the first argument that is neither
// null nor an empty string, all arguments unified to one type.
var coalesceFunc = function.New(&function.Spec{
	VarParam: &function.Parameter{Name: "vals", Type: cty.DynamicPseudoType, AllowUnknown: true, AllowDynamicType: true, AllowNull: true},
	Type: func(args []cty.Value) (cty.Type, error) {
		tys := make([]cty.Type, len(args))
		for i, a := range args {
			tys[i] = a.Type()
		}
		ty, _ := convert.UnifyUnsafe(tys)
		if ty == cty.NilType {
			return cty.NilType, fmt.Errorf("all arguments must have the same type")
		}
		return ty, nil
	},
	Impl: func(args []cty.Value, retType cty.Type) (cty.Value, error) {
		for _, a := range args {
			a, _ = convert.Convert(a, retType)
			if !a.IsKnown() {
				return cty.UnknownVal(retType), nil
			}
			if a.IsNull() || (retType == cty.String && a.RawEquals(cty.StringVal(""))) {
				continue
			}
			return a, nil
		}
		return cty.NilVal, fmt.Errorf("no non-null, non-empty-string arguments")
	},
})

var sha1Func = function.New(&function.Spec{
	Params: []function.Parameter{{Name: "str", Type: cty.String}},
	Type:   function.StaticReturnType(cty.String),
	Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
		h := sha1.Sum([]byte(args[0].AsString()))
		return cty.StringVal(hex.EncodeToString(h[:])), nil
	},
})

var allTrueFunc = function.New(&function.Spec{
	Params: []function.Parameter{{Name: "list", Type: cty.List(cty.Bool)}},
	Type:   function.StaticReturnType(cty.Bool),
	Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
		for it := args[0].ElementIterator(); it.Next(); {
			_, v := it.Element()
			if v.IsNull() || v.False() {
				return cty.False, nil
			}
		}
		return cty.True, nil
	},
})

var anyTrueFunc = function.New(&function.Spec{
	Params: []function.Parameter{{Name: "list", Type: cty.List(cty.Bool)}},
	Type:   function.StaticReturnType(cty.Bool),
	Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
		for it := args[0].ElementIterator(); it.Next(); {
			_, v := it.Element()
			if !v.IsNull() && v.True() {
				return cty.True, nil
			}
		}
		return cty.False, nil
	},
})

// lengthFunc is Terraform's length: the number of elements of a collection,
// or of characters of a string (Terraform counts grapheme clusters; the
// configuration only measures ASCII names, where that is the rune count).
var lengthFunc = function.New(&function.Spec{
	Params: []function.Parameter{{Name: "value", Type: cty.DynamicPseudoType, AllowDynamicType: true}},
	Type:   function.StaticReturnType(cty.Number),
	Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
		switch ty := args[0].Type(); {
		case ty == cty.String:
			return cty.NumberIntVal(int64(utf8.RuneCountInString(args[0].AsString()))), nil
		case ty.IsObjectType():
			return cty.NumberIntVal(int64(len(ty.AttributeTypes()))), nil
		}
		return stdlib.Length(args[0])
	},
})

// sumFunc is Terraform's sum: the total of a non-empty list of numbers.
var sumFunc = function.New(&function.Spec{
	Params: []function.Parameter{{Name: "list", Type: cty.List(cty.Number)}},
	Type:   function.StaticReturnType(cty.Number),
	Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
		if args[0].LengthInt() == 0 {
			return cty.NilVal, fmt.Errorf("cannot sum an empty list")
		}
		total := cty.Zero
		for it := args[0].ElementIterator(); it.Next(); {
			_, v := it.Element()
			total = total.Add(v)
		}
		return total, nil
	},
})

// urlEncodeFunc is Terraform's urlencode: url.QueryEscape.
var urlEncodeFunc = function.New(&function.Spec{
	Params: []function.Parameter{{Name: "str", Type: cty.String}},
	Type:   function.StaticReturnType(cty.String),
	Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
		return cty.StringVal(url.QueryEscape(args[0].AsString())), nil
	},
})

func toFunc(want cty.Type) function.Function {
	return function.New(&function.Spec{
		Params: []function.Parameter{{Name: "v", Type: cty.DynamicPseudoType, AllowNull: true, AllowDynamicType: true}},
		Type: func(args []cty.Value) (cty.Type, error) {
			if want == cty.String {
				return cty.String, nil
			}
			v, err := convert.Convert(args[0], want)
			if err != nil {
				return cty.NilType, err
			}
			return v.Type(), nil
		},
		Impl: func(args []cty.Value, ret cty.Type) (cty.Value, error) {
			return convert.Convert(args[0], ret)
		},
	})
}

func fileFunc(baseDir string) function.Function {
	return function.New(&function.Spec{
		Params: []function.Parameter{{Name: "path", Type: cty.String}},
		Type:   function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			p := args[0].AsString()
			if !filepath.IsAbs(p) {
				p = filepath.Join(baseDir, p)
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return cty.NilVal, err
			}
			return cty.StringVal(string(b)), nil
		},
	})
}
