package devstack

import (
	"fmt"
	"strings"
	"unicode"
)

// filter is a parsed Pub/Sub subscription filter
// (https://cloud.google.com/pubsub/docs/subscription-message-filter): the
// attribute forms `attributes:k`, `attributes.k = "v"`, `attributes.k !=
// "v"`, `hasPrefix(attributes.k, "p")`, combined with NOT (or -), AND, OR
// and parentheses. pstest applies a subscription's filter when it hands out
// messages; the gcloud emulator (0.8.20) ignores filters, so the delivery
// loop applies them itself, as Pub/Sub does: a message the filter refuses is
// acknowledged without being delivered.
type filter interface {
	match(attrs map[string]string) bool
}

type (
	hasAttr    struct{ key string }
	attrEquals struct {
		key, value string
		not        bool
	}
	attrPrefix struct{ key, prefix string }
	notFilter  struct{ f filter }
	andFilter  []filter
	orFilter   []filter
)

func (f hasAttr) match(a map[string]string) bool { _, ok := a[f.key]; return ok }
func (f attrEquals) match(a map[string]string) bool {
	v, ok := a[f.key]
	if f.not {
		return !ok || v != f.value
	}
	return ok && v == f.value
}
func (f attrPrefix) match(a map[string]string) bool {
	v, ok := a[f.key]
	return ok && strings.HasPrefix(v, f.prefix)
}
func (f notFilter) match(a map[string]string) bool { return !f.f.match(a) }
func (f andFilter) match(a map[string]string) bool {
	for _, g := range f {
		if !g.match(a) {
			return false
		}
	}
	return true
}
func (f orFilter) match(a map[string]string) bool {
	for _, g := range f {
		if g.match(a) {
			return true
		}
	}
	return false
}

// parseFilter parses a subscription filter; "" is nil (every message).
func parseFilter(s string) (filter, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	p := &filterParser{toks: nil}
	if err := p.lex(s); err != nil {
		return nil, fmt.Errorf("filter %q: %w", s, err)
	}
	f, err := p.or()
	if err == nil && p.i < len(p.toks) {
		err = fmt.Errorf("unexpected %q", p.toks[p.i].text)
	}
	if err != nil {
		return nil, fmt.Errorf("filter %q: %w", s, err)
	}
	return f, nil
}

type filterToken struct {
	kind byte // 'w' word, 's' string, or the punctuation itself: ( ) , : . = ! (for !=) -
	text string
}

type filterParser struct {
	toks []filterToken
	i    int
}

func (p *filterParser) lex(s string) error {
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '"' || c == '\'':
			var sb strings.Builder
			j := i + 1
			for ; j < len(s) && s[j] != c; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				sb.WriteByte(s[j])
			}
			if j >= len(s) {
				return fmt.Errorf("unterminated string at %d", i)
			}
			p.toks = append(p.toks, filterToken{'s', sb.String()})
			i = j + 1
		case c == '!' && i+1 < len(s) && s[i+1] == '=':
			p.toks = append(p.toks, filterToken{'!', "!="})
			i += 2
		case strings.IndexByte("(),:.=-", c) >= 0:
			p.toks = append(p.toks, filterToken{c, string(c)})
			i++
		case c == '_' || unicode.IsLetter(rune(c)) || unicode.IsDigit(rune(c)):
			j := i
			for j < len(s) && (s[j] == '_' || s[j] == '-' && j > i || unicode.IsLetter(rune(s[j])) || unicode.IsDigit(rune(s[j]))) {
				j++
			}
			p.toks = append(p.toks, filterToken{'w', s[i:j]})
			i = j
		default:
			return fmt.Errorf("unexpected %q at %d", c, i)
		}
	}
	return nil
}

func (p *filterParser) peek() filterToken {
	if p.i < len(p.toks) {
		return p.toks[p.i]
	}
	return filterToken{}
}

func (p *filterParser) take(kind byte) (filterToken, error) {
	t := p.peek()
	if t.kind != kind {
		if t.kind == 0 {
			return t, fmt.Errorf("unexpected end, want %q", kind)
		}
		return t, fmt.Errorf("unexpected %q, want %q", t.text, kind)
	}
	p.i++
	return t, nil
}

func (p *filterParser) word(w string) bool {
	if t := p.peek(); t.kind == 'w' && t.text == w {
		p.i++
		return true
	}
	return false
}

func (p *filterParser) or() (filter, error) {
	f, err := p.and()
	if err != nil {
		return nil, err
	}
	fs := orFilter{f}
	for p.word("OR") {
		g, err := p.and()
		if err != nil {
			return nil, err
		}
		fs = append(fs, g)
	}
	if len(fs) == 1 {
		return f, nil
	}
	return fs, nil
}

func (p *filterParser) and() (filter, error) {
	f, err := p.unary()
	if err != nil {
		return nil, err
	}
	fs := andFilter{f}
	for p.word("AND") {
		g, err := p.unary()
		if err != nil {
			return nil, err
		}
		fs = append(fs, g)
	}
	if len(fs) == 1 {
		return f, nil
	}
	return fs, nil
}

func (p *filterParser) unary() (filter, error) {
	if p.word("NOT") || p.peek().kind == '-' && p.skip() {
		f, err := p.unary()
		return notFilter{f}, err
	}
	if p.peek().kind == '(' {
		p.i++
		f, err := p.or()
		if err != nil {
			return nil, err
		}
		_, err = p.take(')')
		return f, err
	}
	if p.word("hasPrefix") {
		if _, err := p.take('('); err != nil {
			return nil, err
		}
		key, err := p.attrName()
		if err != nil {
			return nil, err
		}
		if _, err := p.take(','); err != nil {
			return nil, err
		}
		pre, err := p.take('s')
		if err != nil {
			return nil, err
		}
		if _, err := p.take(')'); err != nil {
			return nil, err
		}
		return attrPrefix{key, pre.text}, nil
	}
	if !p.word("attributes") {
		return nil, fmt.Errorf("unexpected %q, want attributes, hasPrefix, NOT or (", p.peek().text)
	}
	switch p.peek().kind {
	case ':':
		p.i++
		key, err := p.key()
		return hasAttr{key}, err
	case '.':
		p.i++
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		op := p.peek()
		if op.kind != '=' && op.kind != '!' {
			return nil, fmt.Errorf("unexpected %q after attributes.%s, want = or !=", op.text, key)
		}
		p.i++
		v, err := p.take('s')
		return attrEquals{key: key, value: v.text, not: op.kind == '!'}, err
	}
	return nil, fmt.Errorf("unexpected %q after attributes, want a ':' or a '.'", p.peek().text)
}

func (p *filterParser) skip() bool { p.i++; return true }

// attrName reads `attributes.k` (inside hasPrefix).
func (p *filterParser) attrName() (string, error) {
	if !p.word("attributes") {
		return "", fmt.Errorf("unexpected %q, want attributes.<name>", p.peek().text)
	}
	if _, err := p.take('.'); err != nil {
		return "", err
	}
	return p.key()
}

// key reads an attribute name: a word or a quoted string.
func (p *filterParser) key() (string, error) {
	t := p.peek()
	if t.kind == 'w' || t.kind == 's' {
		p.i++
		return t.text, nil
	}
	return "", fmt.Errorf("unexpected %q, want an attribute name", t.text)
}
