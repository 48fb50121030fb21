package dashview

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Query is a parsed PromQL expression of the subset the dashboard uses:
//
//	expr     = term { "/" term }
//	term     = aggr | call | selector | number | "(" expr ")"
//	aggr     = ("sum" | "max" | "min" | "avg") "by" "(" labels ")" "(" expr ")"
//	call     = "rate" "(" range ")" | "increase" "(" range ")"
//	         | "histogram_quantile" "(" number "," expr ")"
//	range    = selector "[" duration "]"
//	selector = "{" "\"name\"" { "," label ("=" | "!=" | "=~" | "!~") string } "}"
//
// (metric and label names quoted, as Cloud Monitoring's PromQL takes the
// OpenTelemetry names, https://cloud.google.com/monitoring/promql). rate
// and increase take the first and last samples in the range, without
// Prometheus's extrapolation to the range's ends.
type Query struct {
	src  string
	root node
}

// Parse parses q.
func Parse(q string) (*Query, error) {
	p := &parser{src: q}
	p.next()
	n, err := p.expr()
	if err == nil && p.tok.kind != tEOF {
		err = p.errorf("unexpected %q", p.tok.text)
	}
	if err != nil {
		return nil, err
	}
	return &Query{src: q, root: n}, nil
}

// Series is one output series of a query over a recording: its labels and
// one value per snapshot (NaN where it had none).
type Series struct {
	Labels map[string]string
	Values []float64
}

// Times returns the recording's snapshot times.
func (r *Recording) Times() []time.Time {
	out := make([]time.Time, len(r.snaps))
	for i, s := range r.snaps {
		out[i] = s.at
	}
	return out
}

// Eval evaluates the query at each snapshot of r.
func (q *Query) Eval(r *Recording) []Series {
	byKey := map[string]*Series{}
	var order []string
	for i := range r.snaps {
		for _, p := range q.root.eval(r, i) {
			if math.IsNaN(p.value) || math.IsInf(p.value, 0) {
				continue
			}
			k := key(p.labels)
			s := byKey[k]
			if s == nil {
				s = &Series{Labels: p.labels, Values: make([]float64, len(r.snaps))}
				for j := range s.Values {
					s.Values[j] = math.NaN()
				}
				byKey[k] = s
				order = append(order, k)
			}
			s.Values[i] = p.value
		}
	}
	sort.Strings(order)
	out := make([]Series, len(order))
	for i, k := range order {
		out[i] = *byKey[k]
	}
	return out
}

type point struct {
	labels map[string]string
	value  float64
}

type vector []point

type node interface {
	eval(r *Recording, i int) vector
}

type number float64

func (n number) eval(*Recording, int) vector {
	return vector{{labels: map[string]string{}, value: float64(n)}}
}

type matcher struct {
	label, op, value string
	re               *regexp.Regexp
}

func (m matcher) matches(l map[string]string) bool {
	v := l[m.label]
	switch m.op {
	case "=":
		return v == m.value
	case "!=":
		return v != m.value
	case "=~":
		return m.re.MatchString(v)
	}
	return !m.re.MatchString(v)
}

type selector struct {
	matchers []matcher
	rng      time.Duration // 0: an instant selector
}

func (s *selector) match(l map[string]string) bool {
	for _, m := range s.matchers {
		if !m.matches(l) {
			return false
		}
	}
	return true
}

func (s *selector) eval(r *Recording, i int) vector {
	var out vector
	for _, smp := range r.snaps[i].series {
		if s.match(smp.labels) {
			out = append(out, point{labels: smp.labels, value: smp.value})
		}
	}
	return out
}

// rangeCall is rate or increase over a range selector.
type rangeCall struct {
	fn  string
	sel *selector
}

func (c *rangeCall) eval(r *Recording, i int) vector {
	var out vector
	from := r.snaps[i].at.Add(-c.sel.rng)
	for k, smp := range r.snaps[i].series {
		if !c.sel.match(smp.labels) {
			continue
		}
		first := -1
		for j := 0; j <= i; j++ {
			if !r.snaps[j].at.Before(from) {
				if _, ok := r.value(j, k, smp.cumulative); ok {
					first = j
					break
				}
			}
		}
		if first < 0 || first == i {
			continue // one sample: no rate
		}
		v0, _ := r.value(first, k, smp.cumulative)
		d := smp.value - v0
		if c.fn == "rate" {
			d /= r.snaps[i].at.Sub(r.snaps[first].at).Seconds()
		}
		out = append(out, point{labels: without(smp.labels, "__name__"), value: d})
	}
	return out
}

type aggr struct {
	op   string
	by   []string
	expr node
}

func (a *aggr) eval(r *Recording, i int) vector {
	groups := map[string]*point{}
	counts := map[string]int{}
	for _, p := range a.expr.eval(r, i) {
		l := map[string]string{}
		for _, b := range a.by {
			if v := p.labels[b]; v != "" {
				l[b] = v
			}
		}
		k := key(l)
		g := groups[k]
		if g == nil {
			groups[k], counts[k] = &point{labels: l, value: p.value}, 1
			continue
		}
		counts[k]++
		switch a.op {
		case "sum", "avg":
			g.value += p.value
		case "max":
			g.value = math.Max(g.value, p.value)
		case "min":
			g.value = math.Min(g.value, p.value)
		}
	}
	out := make(vector, 0, len(groups))
	for k, g := range groups {
		if a.op == "avg" {
			g.value /= float64(counts[k])
		}
		out = append(out, *g)
	}
	return out
}

type quantile struct {
	q    float64
	expr node
}

// eval is Prometheus's histogram_quantile: per label set but le, the
// bucket the q-th observation falls in, interpolated linearly within it
// (from 0 for the first bucket); in the +Inf bucket, the highest finite
// bound.
func (h *quantile) eval(r *Recording, i int) vector {
	type bucket struct{ le, count float64 }
	groups := map[string][]bucket{}
	labels := map[string]map[string]string{}
	for _, p := range h.expr.eval(r, i) {
		le, err := strconv.ParseFloat(p.labels["le"], 64)
		if err != nil {
			continue
		}
		l := without(p.labels, "le")
		k := key(l)
		groups[k], labels[k] = append(groups[k], bucket{le, p.value}), l
	}
	var out vector
	for k, bs := range groups {
		sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
		total := bs[len(bs)-1].count
		if total <= 0 || !math.IsInf(bs[len(bs)-1].le, 1) {
			continue
		}
		rank := h.q * total
		v := math.NaN()
		for j, b := range bs {
			if b.count < rank {
				continue
			}
			if math.IsInf(b.le, 1) {
				if j > 0 {
					v = bs[j-1].le
				}
				break
			}
			lo, below := 0.0, 0.0
			if j > 0 {
				lo, below = bs[j-1].le, bs[j-1].count
			}
			if b.le <= 0 {
				v = b.le
				break
			}
			v = lo + (b.le-lo)*(rank-below)/(b.count-below)
			break
		}
		out = append(out, point{labels: labels[k], value: v})
	}
	return out
}

type binary struct {
	op   byte
	l, r node
}

// eval matches the two sides' series one to one on all their labels.
func (b *binary) eval(r *Recording, i int) vector {
	right := map[string]float64{}
	for _, p := range b.r.eval(r, i) {
		right[key(p.labels)] = p.value
	}
	var out vector
	for _, p := range b.l.eval(r, i) {
		d, ok := right[key(p.labels)]
		if !ok {
			continue
		}
		out = append(out, point{labels: p.labels, value: p.value / d})
	}
	return out
}

func without(l map[string]string, drop string) map[string]string {
	out := make(map[string]string, len(l))
	for k, v := range l {
		if k != drop {
			out[k] = v
		}
	}
	return out
}

// The parser.

type tokKind int

const (
	tEOF tokKind = iota
	tIdent
	tString
	tNumber
	tPunct
)

type token struct {
	kind tokKind
	text string
}

type parser struct {
	src string
	pos int
	tok token
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("dashview: PromQL %q at %d: %s", p.src, p.pos, fmt.Sprintf(format, args...))
}

func (p *parser) next() {
	for p.pos < len(p.src) && unicode.IsSpace(rune(p.src[p.pos])) {
		p.pos++
	}
	if p.pos >= len(p.src) {
		p.tok = token{kind: tEOF}
		return
	}
	c := p.src[p.pos]
	start := p.pos
	switch {
	case c == '"':
		p.pos++
		var b strings.Builder
		for p.pos < len(p.src) && p.src[p.pos] != '"' {
			if p.src[p.pos] == '\\' && p.pos+1 < len(p.src) {
				p.pos++
			}
			b.WriteByte(p.src[p.pos])
			p.pos++
		}
		p.pos++ // the closing quote
		p.tok = token{tString, b.String()}
	case c >= '0' && c <= '9' || c == '.':
		for p.pos < len(p.src) && (p.src[p.pos] >= '0' && p.src[p.pos] <= '9' || p.src[p.pos] == '.' || unicode.IsLetter(rune(p.src[p.pos]))) {
			p.pos++
		}
		p.tok = token{tNumber, p.src[start:p.pos]}
	case c == '_' || unicode.IsLetter(rune(c)):
		for p.pos < len(p.src) && (p.src[p.pos] == '_' || p.src[p.pos] == ':' || unicode.IsLetter(rune(p.src[p.pos])) || unicode.IsDigit(rune(p.src[p.pos]))) {
			p.pos++
		}
		p.tok = token{tIdent, p.src[start:p.pos]}
	case strings.HasPrefix(p.src[p.pos:], "=~") || strings.HasPrefix(p.src[p.pos:], "!=") || strings.HasPrefix(p.src[p.pos:], "!~"):
		p.pos += 2
		p.tok = token{tPunct, p.src[start:p.pos]}
	default:
		p.pos++
		p.tok = token{tPunct, string(c)}
	}
}

func (p *parser) expect(text string) error {
	if p.tok.kind == tEOF || p.tok.text != text {
		return p.errorf("want %q, have %q", text, p.tok.text)
	}
	p.next()
	return nil
}

func (p *parser) expr() (node, error) {
	l, err := p.term()
	for err == nil && p.tok.kind == tPunct && p.tok.text == "/" {
		p.next()
		var r node
		if r, err = p.term(); err == nil {
			l = &binary{op: '/', l: l, r: r}
		}
	}
	return l, err
}

func (p *parser) term() (node, error) {
	switch p.tok.kind {
	case tNumber:
		f, err := strconv.ParseFloat(p.tok.text, 64)
		if err != nil {
			return nil, p.errorf("number %q", p.tok.text)
		}
		p.next()
		return number(f), nil
	case tPunct:
		switch p.tok.text {
		case "{":
			return p.selector()
		case "(":
			p.next()
			n, err := p.expr()
			if err != nil {
				return nil, err
			}
			return n, p.expect(")")
		}
	case tIdent:
		name := p.tok.text
		p.next()
		switch name {
		case "sum", "max", "min", "avg":
			a := &aggr{op: name}
			if err := p.expect("by"); err != nil {
				return nil, err
			}
			if err := p.expect("("); err != nil {
				return nil, err
			}
			for p.tok.text != ")" {
				if p.tok.kind != tIdent && p.tok.kind != tString {
					return nil, p.errorf("want a label, have %q", p.tok.text)
				}
				a.by = append(a.by, p.tok.text)
				p.next()
				if p.tok.text == "," {
					p.next()
				}
			}
			p.next()
			if err := p.expect("("); err != nil {
				return nil, err
			}
			var err error
			if a.expr, err = p.expr(); err != nil {
				return nil, err
			}
			return a, p.expect(")")
		case "rate", "increase":
			if err := p.expect("("); err != nil {
				return nil, err
			}
			n, err := p.selector()
			if err != nil {
				return nil, err
			}
			s := n.(*selector)
			if s.rng == 0 {
				return nil, p.errorf("%s needs a range selector", name)
			}
			return &rangeCall{fn: name, sel: s}, p.expect(")")
		case "histogram_quantile":
			if err := p.expect("("); err != nil {
				return nil, err
			}
			q, err := strconv.ParseFloat(p.tok.text, 64)
			if p.tok.kind != tNumber || err != nil {
				return nil, p.errorf("histogram_quantile wants a number first, not %q", p.tok.text)
			}
			p.next()
			if err := p.expect(","); err != nil {
				return nil, err
			}
			e, err := p.expr()
			if err != nil {
				return nil, err
			}
			return &quantile{q: q, expr: e}, p.expect(")")
		}
		return nil, p.errorf("unsupported function or aggregation %q", name)
	}
	return nil, p.errorf("unexpected %q", p.tok.text)
}

func (p *parser) selector() (node, error) {
	if err := p.expect("{"); err != nil {
		return nil, err
	}
	s := &selector{}
	for first := true; p.tok.text != "}"; first = false {
		if p.tok.kind == tEOF {
			return nil, p.errorf("unterminated selector")
		}
		if !first {
			if err := p.expect(","); err != nil {
				return nil, err
			}
		}
		if p.tok.kind != tString && p.tok.kind != tIdent {
			return nil, p.errorf("want a name or label, have %q", p.tok.text)
		}
		label := p.tok.text
		p.next()
		if first && (p.tok.text == "," || p.tok.text == "}") {
			s.matchers = append(s.matchers, matcher{label: "__name__", op: "=", value: label})
			continue
		}
		op := p.tok.text
		if op != "=" && op != "!=" && op != "=~" && op != "!~" {
			return nil, p.errorf("want a matcher operator, have %q", op)
		}
		p.next()
		if p.tok.kind != tString {
			return nil, p.errorf("want a quoted value, have %q", p.tok.text)
		}
		m := matcher{label: label, op: op, value: p.tok.text}
		if op == "=~" || op == "!~" {
			re, err := regexp.Compile("^(?:" + m.value + ")$")
			if err != nil {
				return nil, p.errorf("regexp %q: %v", m.value, err)
			}
			m.re = re
		}
		s.matchers = append(s.matchers, m)
		p.next()
	}
	p.next()
	if p.tok.text == "[" {
		p.next()
		d, err := parseDuration(p.tok.text)
		if err != nil {
			return nil, p.errorf("range %q: %v", p.tok.text, err)
		}
		s.rng = d
		p.next()
		if err := p.expect("]"); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// parseDuration reads a PromQL duration: Go's units plus d, w and y.
func parseDuration(s string) (time.Duration, error) {
	for unit, d := range map[string]time.Duration{"d": 24 * time.Hour, "w": 7 * 24 * time.Hour, "y": 365 * 24 * time.Hour} {
		if n, ok := strings.CutSuffix(s, unit); ok {
			if v, err := strconv.Atoi(n); err == nil {
				return time.Duration(v) * d, nil
			}
		}
	}
	return time.ParseDuration(s)
}
