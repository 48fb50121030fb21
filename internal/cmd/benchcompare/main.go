// Command benchcompare runs chosen benchmarks of a base commit and of the
// working tree interleaved (base, head, base, head, … for -rounds rounds)
// in one sitting, on the Postgres and emulators its environment names (run
// it under testenv -durable: make bench-compare does), and prints each
// figure's median on both sides and the ratio head/base. Figures measured
// on one host at one hour are comparable only with each other: a ratio is
// what says whether a change made the code faster or slower, whatever the
// host.
//
//	go run ./internal/cmd/testenv -durable -- go run ./internal/cmd/benchcompare -base 06225b8 \
//	    ./shared/relay='^BenchmarkDrain$' ./functions/consume='^BenchmarkConsume$'
//
// The base is checked out with git worktree into a temporary directory
// (removed afterwards) and its test binaries built there, the head's from
// the working tree as it is; every round runs the same binaries. Each
// round's ratio pairs a base run with the head run after it; the spread
// of those ratios beside the median says how much the machine moved, and
// a figure whose rounds spread more than the effect it shows says so.
// The benchmarks' output is kept in .bench-compare.out.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	base := flag.String("base", "", "the base commit (required)")
	rounds := flag.Int("rounds", 3, "rounds: each runs every chosen benchmark on the base, then on the head")
	out := flag.String("out", ".bench-compare.out", "where the benchmarks' whole output is kept")
	timeout := flag.Duration("timeout", 60*time.Minute, "each benchmark run's -test.timeout")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: benchcompare -base <commit> [-rounds n] <package>=<benchmark regexp> ...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *base == "" || flag.NArg() == 0 || *rounds < 1 {
		flag.Usage()
		os.Exit(2)
	}
	var benches []bench
	for _, a := range flag.Args() {
		pkg, re, ok := strings.Cut(a, "=")
		if !ok || pkg == "" || re == "" {
			fmt.Fprintf(os.Stderr, "benchcompare: %q: want <package>=<benchmark regexp>, e.g. ./shared/relay='^BenchmarkDrain$'\n", a)
			os.Exit(2)
		}
		if _, err := regexp.Compile(re); err != nil {
			fmt.Fprintf(os.Stderr, "benchcompare: %q: %v\n", re, err)
			os.Exit(2)
		}
		benches = append(benches, bench{pkg: filepath.Clean(pkg), re: re})
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, *base, *rounds, *out, *timeout, benches, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "benchcompare: %v\n", err)
		os.Exit(1)
	}
}

type bench struct{ pkg, re string }

// side is the base or the head: its tree and its built test binaries.
type side struct {
	name, tree, label string
	bins              map[string]string // by package
}

func run(ctx context.Context, base string, rounds int, outPath string, timeout time.Duration, benches []bench, w io.Writer) error {
	root, err := git(ctx, "", "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	baseSHA, err := git(ctx, root, "rev-parse", "--verify", base+"^{commit}")
	if err != nil {
		return fmt.Errorf("base %q: %w", base, err)
	}
	headSHA, err := git(ctx, root, "rev-parse", "HEAD")
	if err != nil {
		return err
	}
	headLabel := headSHA[:12]
	if st, _ := git(ctx, root, "status", "--porcelain", "--untracked-files=no"); st != "" {
		headLabel += " + uncommitted changes"
	}
	tmp, err := os.MkdirTemp("", "relaybus-bench-compare-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	baseTree := filepath.Join(tmp, "base")
	if _, err := git(ctx, root, "worktree", "add", "--detach", baseTree, baseSHA); err != nil {
		return err
	}
	defer func() {
		_, _ = git(context.Background(), root, "worktree", "remove", "--force", baseTree)
		_, _ = git(context.Background(), root, "worktree", "prune")
	}()
	sides := []*side{
		{name: "base", tree: baseTree, label: baseSHA[:12], bins: map[string]string{}},
		{name: "head", tree: root, label: headLabel, bins: map[string]string{}},
	}
	for _, s := range sides {
		for _, b := range benches {
			if _, ok := s.bins[b.pkg]; ok {
				continue
			}
			bin := filepath.Join(tmp, s.name+"-"+strings.NewReplacer("/", "_", ".", "_").Replace(b.pkg)+".test")
			cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, "./"+strings.TrimPrefix(b.pkg, "./"))
			cmd.Dir = s.tree
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("build %s's %s: %w\n%s", s.name, b.pkg, err, out)
			}
			s.bins[b.pkg] = bin
		}
	}
	logf, err := os.Create(filepath.Join(root, outPath))
	if err != nil {
		return err
	}
	defer logf.Close()

	start := time.Now()
	load0 := loadAvg()
	fmt.Fprintf(w, "bench-compare: base %s, head %s; %d rounds of base then head; %s\n", sides[0].label, sides[1].label, rounds, machine())
	// figures[side][name] is one value per round, NaN when the round did
	// not print it; units by name; order of first appearance.
	figures := map[string]map[string][]float64{"base": {}, "head": {}}
	units := map[string]string{}
	var order []string
	var failures []string
	for r := range rounds {
		for _, s := range sides {
			for _, b := range benches {
				t0 := time.Now()
				got, err := runBench(ctx, s, b, timeout, logf)
				fmt.Fprintf(w, "  round %d %s %s %s: %d figures in %v\n", r+1, s.name, b.pkg, b.re, len(got), time.Since(t0).Round(time.Second))
				if err != nil {
					failures = append(failures, fmt.Sprintf("round %d %s %s: %v", r+1, s.name, b.pkg, err))
					fmt.Fprintf(w, "    FAILED: %v\n", err)
				}
				for _, f := range got {
					if _, ok := units[f.name]; !ok {
						units[f.name] = f.unit
						order = append(order, f.name)
					}
					vs := figures[s.name][f.name]
					for len(vs) < r {
						vs = append(vs, math.NaN())
					}
					figures[s.name][f.name] = append(vs, f.value)
				}
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	fmt.Fprintf(w, "\nload average (1 min) %s at the start, %s at the end; %v in all; output in %s\n\n", load0, loadAvg(), time.Since(start).Round(time.Second), outPath)
	printTable(w, order, units, figures, rounds)
	if len(failures) > 0 {
		return fmt.Errorf("%d benchmark runs failed (their rounds print no figure):\n  %s", len(failures), strings.Join(failures, "\n  "))
	}
	return nil
}

type figure struct {
	name, unit string
	value      float64
}

var benchLine = regexp.MustCompile(`^BENCH (\S+) (-?[0-9.eE+-]+) (.+)$`)

// runBench runs b's binary of side s once in its package's directory and
// returns the figures its BENCH lines printed.
func runBench(ctx context.Context, s *side, b bench, timeout time.Duration, log io.Writer) ([]figure, error) {
	cmd := exec.CommandContext(ctx, s.bins[b.pkg], "-test.run", "^$", "-test.bench", b.re, "-test.benchtime", "1x",
		"-test.timeout", timeout.String())
	cmd.Dir = filepath.Join(s.tree, strings.TrimPrefix(b.pkg, "./"))
	fmt.Fprintf(log, "=== %s %s %s %s\n", time.Now().Format(time.RFC3339), s.name, b.pkg, b.re)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); pw.Close() }()
	var got []figure
	sc := bufio.NewScanner(pr)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(log, line)
		if m := benchLine.FindStringSubmatch(line); m != nil {
			if v, err := strconv.ParseFloat(m[2], 64); err == nil {
				got = append(got, figure{name: m[1], value: v, unit: m[3]})
			}
		}
	}
	if err := <-done; err != nil {
		return nil, err // a failed run's figures do not count
	}
	return got, nil
}

func printTable(w io.Writer, order []string, units map[string]string, figures map[string]map[string][]float64, rounds int) {
	fmt.Fprintln(w, "| figure | unit | base (median) | head (median) | head/base | rounds' head/base | |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---|---|")
	for _, name := range order {
		bs, hs := figures["base"][name], figures["head"][name]
		var ratios []float64
		for i := range rounds {
			if i < len(bs) && i < len(hs) && !math.IsNaN(bs[i]) && !math.IsNaN(hs[i]) && bs[i] != 0 {
				ratios = append(ratios, hs[i]/bs[i])
			}
		}
		bm, hm := median(bs), median(hs)
		note := ""
		ratio, spread := "–", "–"
		switch {
		case math.IsNaN(bm):
			note = "not printed by the base"
		case math.IsNaN(hm):
			note = "not printed by the head"
		case len(ratios) > 0:
			r := median(ratios)
			ratio = fmt.Sprintf("%.3f", r)
			lo, hi := slices.Min(ratios), slices.Max(ratios)
			spread = fmt.Sprintf("%.3f..%.3f", lo, hi)
			if hi-lo > math.Abs(r-1) {
				note = "rounds spread more than the effect"
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", name, units[name], num(bm), num(hm), ratio, spread, note)
	}
}

// median of the values that are numbers; NaN when none is.
func median(xs []float64) float64 {
	var s []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return math.NaN()
	}
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func num(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
}

func git(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// machine describes the host: CPUs and their model.
func machine() string {
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%d CPUs (%s), %s/%s, %s", runtime.NumCPU(), model, runtime.GOOS, runtime.GOARCH, runtime.Version())
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
