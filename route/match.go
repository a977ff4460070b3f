package route

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Rule maps a topic pattern to a policy. The policy is opaque to route.
//
// Pattern syntax: "[domain://]tenant/namespace/topic". Each of the three
// segments is literal text in which '*' matches any run of characters, '/'
// excepted (so "orders-*" matches "orders-eu" and "orders-"). Without a domain
// the rule matches persistent and non-persistent topics alike. Patterns match
// a partition's parent topic: "a/b/t" matches "a/b/t-partition-3".
type Rule[P any] struct {
	Pattern string
	Policy  P
}

// RuleError is a problem with one rule, found at load time.
type RuleError struct {
	Index   int
	Pattern string
	Problem string
}

func (e *RuleError) Error() string {
	return fmt.Sprintf("route: rule %d (%q): %s", e.Index, e.Pattern, e.Problem)
}

// Matcher finds the policy of a topic. Rules are tried in order and the FIRST
// match wins: the order in the configuration is the precedence, as in a
// firewall, which is easy to read and never ties. A rule that an earlier rule
// always catches first is refused at load time, so a misordered configuration
// (for example "*/*/*" first) fails loudly instead of silently shadowing.
//
// A Matcher is immutable; any goroutine may use it concurrently.
type Matcher[P any] struct {
	rules []compiledRule[P]
}

type compiledRule[P any] struct {
	index  int        // position in the rules given to NewMatcher
	domain string     // "" for any
	segs   [3]segment // tenant, namespace, topic
	policy P
}

// segment is one glob segment split at its stars: "a*b*c" is parts
// ["a","b","c"]; a leading or trailing star gives an empty first or last part.
type segment struct {
	raw   string
	parts []string
}

// maxSegmentLen bounds a pattern segment, far above Pulsar's own name limits,
// so that matching cost stays bounded for any configuration.
const maxSegmentLen = 1024

// NewMatcher validates and compiles rules. All problems are reported at once,
// each as a *RuleError naming the rule's index. Any goroutine may call it.
func NewMatcher[P any](rules []Rule[P]) (*Matcher[P], error) {
	m := &Matcher[P]{rules: make([]compiledRule[P], 0, len(rules))}
	var errs []error
	for i, r := range rules {
		c, problem := compile[P](r.Pattern)
		if problem != "" {
			errs = append(errs, &RuleError{Index: i, Pattern: r.Pattern, Problem: problem})
			continue
		}
		c.policy, c.index = r.Policy, i
		for _, earlier := range m.rules {
			if earlier.covers(c) {
				errs = append(errs, &RuleError{Index: i, Pattern: r.Pattern,
					Problem: fmt.Sprintf("never matches: every topic it matches is matched first by rule %d (%q)",
						earlier.index, rules[earlier.index].Pattern)})
				break
			}
		}
		m.rules = append(m.rules, c)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return m, nil
}

// ParsePattern reports whether pattern is a valid rule pattern, for config
// validation that wants to check one pattern alone. Any goroutine may call it.
func ParsePattern(pattern string) error {
	if _, problem := compile[struct{}](pattern); problem != "" {
		return fmt.Errorf("route: pattern %q: %s", pattern, problem)
	}
	return nil
}

func compile[P any](pattern string) (compiledRule[P], string) {
	var c compiledRule[P]
	if !utf8.ValidString(pattern) {
		return c, "not valid UTF-8"
	}
	rest := pattern
	if d, r, ok := strings.Cut(pattern, "://"); ok {
		if d != DomainPersistent && d != DomainNonPersistent {
			return c, fmt.Sprintf("unknown domain %q (want %q or %q)", d, DomainPersistent, DomainNonPersistent)
		}
		c.domain, rest = d, r
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return c, fmt.Sprintf("has %d segments, want 3: tenant/namespace/topic", len(parts))
	}
	names := [3]string{"tenant", "namespace", "topic"}
	for i, p := range parts {
		switch {
		case p == "":
			return c, names[i] + " segment is empty"
		case len(p) > maxSegmentLen:
			return c, fmt.Sprintf("%s segment longer than %d bytes", names[i], maxSegmentLen)
		case strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }):
			return c, names[i] + " segment has a control character"
		case strings.Contains(p, "://"):
			return c, names[i] + " segment contains \"://\""
		}
		c.segs[i] = segment{raw: p, parts: strings.Split(p, "*")}
	}
	if t := c.segs[2].raw; strings.Contains(t, partitionSuffix) && !strings.Contains(t, "*") {
		if pt, err := ParseTopic("a/b/" + t); err == nil && pt.Partition >= 0 {
			return c, "topic segment names a partition; patterns match the parent topic, so it would never match"
		}
	}
	return c, ""
}

// Match returns the policy of the first rule matching topic, that rule's
// index, and true; or the zero policy, -1 and false when no rule matches or
// the name does not parse. It does not allocate beyond parsing.
// Any goroutine may call it.
func (m *Matcher[P]) Match(topic string) (policy P, index int, ok bool) {
	t, err := ParseTopic(topic)
	if err != nil {
		return policy, -1, false
	}
	return m.MatchTopic(t)
}

// MatchTopic is Match for an already parsed topic. Any goroutine may call it.
func (m *Matcher[P]) MatchTopic(t Topic) (policy P, index int, ok bool) {
	for i := range m.rules {
		r := &m.rules[i]
		if (r.domain == "" || r.domain == t.Domain) &&
			r.segs[0].match(t.Tenant) && r.segs[1].match(t.Namespace) && r.segs[2].match(t.Local) {
			return r.policy, r.index, true
		}
	}
	return policy, -1, false
}

// match reports whether s matches the glob. With '*' as the only wildcard,
// taking the leftmost occurrence of each middle part is always safe, so one
// pass suffices: O(len(s) * len(pattern)) at worst.
func (g segment) match(s string) bool {
	if len(g.parts) == 1 {
		return s == g.raw
	}
	first, last := g.parts[0], g.parts[len(g.parts)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	mid := s[len(first) : len(s)-len(last)]
	for _, p := range g.parts[1 : len(g.parts)-1] {
		i := strings.Index(mid, p)
		if i < 0 {
			return false
		}
		mid = mid[i+len(p):]
	}
	return true
}

// covers is a conservative "r matches everything o matches" check: per segment
// r is "*" or identical text, and r's domain is absent or equal. It misses
// subtler shadowing ("a*" before "ab*"), which stays legal.
func (r compiledRule[P]) covers(o compiledRule[P]) bool {
	if r.domain != "" && r.domain != o.domain {
		return false
	}
	for i := range r.segs {
		if r.segs[i].raw != "*" && r.segs[i].raw != o.segs[i].raw {
			return false
		}
	}
	return true
}
