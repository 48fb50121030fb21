// Command fuzz runs every fuzz target in the module for a while, one after
// the other: make fuzz. The targets are found in the source (every
// func FuzzXxx(*testing.F) in a _test.go file), not listed, so a target
// added or moved is fuzzed without anyone remembering to name it; and a
// target that go test did not fuzz (go test -fuzz with no match passes
// silently) fails the run.
//
//	go run ./internal/cmd/fuzz -fuzztime 60s [-run regexp]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	fuzztime := flag.Duration("fuzztime", 60*time.Second, "how long each target is fuzzed")
	only := flag.String("run", "", "fuzz only the targets whose package path/name matches this regexp")
	list := flag.Bool("list", false, "list the targets found and exit")
	flag.Parse()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	targets, err := discover(".")
	if err != nil {
		fmt.Fprintf(os.Stderr, "fuzz: %v\n", err)
		os.Exit(1)
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fuzz: -run: %v\n", err)
			os.Exit(2)
		}
		targets = slices.DeleteFunc(targets, func(t target) bool { return !re.MatchString(t.String()) })
	}
	if len(targets) == 0 {
		fmt.Fprintln(os.Stderr, "fuzz: no fuzz target found")
		os.Exit(1)
	}
	for _, t := range targets {
		if *list {
			fmt.Println(t)
			continue
		}
		fmt.Printf("fuzz: %s for %v\n", t, *fuzztime)
		if err := fuzz(ctx, t, *fuzztime, os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "fuzz: %s: %v\n", t, err)
			os.Exit(1)
		}
	}
}

// target is one fuzz function: its package directory (relative, ./…) and
// name.
type target struct{ dir, name string }

func (t target) String() string { return t.dir + "." + t.name }

// discover returns every fuzz target in the module under root, in
// directory and name order. A directory named testdata, or starting with
// '.' or '_', is skipped as go build does.
func discover(root string) ([]target, error) {
	var out []target
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			n := d.Name()
			if path != root && (n == "testdata" || n == "vendor" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !isFuzzName(fn.Name.Name) || !takesF(fn) {
				continue
			}
			out = append(out, target{dir: "./" + filepath.ToSlash(filepath.Dir(path)), name: fn.Name.Name})
		}
		return nil
	})
	slices.SortFunc(out, func(a, b target) int { return strings.Compare(a.String(), b.String()) })
	return out, err
}

// isFuzzName is go test's rule: Fuzz, then nothing or not a lower-case
// letter.
func isFuzzName(name string) bool {
	rest, ok := strings.CutPrefix(name, "Fuzz")
	return ok && (rest == "" || !('a' <= rest[0] && rest[0] <= 'z'))
}

// takesF reports whether fn's one parameter is *testing.F.
func takesF(fn *ast.FuncDecl) bool {
	ps := fn.Type.Params.List
	if len(ps) != 1 || len(ps[0].Names) > 1 {
		return false
	}
	star, ok := ps[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "F"
}

// fuzz runs go test -fuzz on t for d and fails when go test did not fuzz
// it: it passes, saying "no fuzz tests to fuzz", for a name it does not
// find.
func fuzz(ctx context.Context, t target, d time.Duration, w io.Writer) error {
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-fuzz", "^"+regexp.QuoteMeta(t.name)+"$", "-fuzztime", d.String(), t.dir)
	var out strings.Builder
	cmd.Stdout = io.MultiWriter(w, &out)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		return err
	}
	if strings.Contains(out.String(), "no fuzz tests to fuzz") || !strings.Contains(out.String(), "fuzz: elapsed") {
		return errors.New("go test did not fuzz it: no such fuzz target in " + t.dir)
	}
	return nil
}
