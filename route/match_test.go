package route

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
)

func TestParseTopic(t *testing.T) {
	tests := []struct {
		in      string
		want    Topic
		wantErr bool
	}{
		{"persistent://public/default/orders", Topic{"persistent", "public", "default", "orders", -1}, false},
		{"non-persistent://t/ns/x", Topic{"non-persistent", "t", "ns", "x", -1}, false},
		{"t/ns/x", Topic{"persistent", "t", "ns", "x", -1}, false},
		{"orders", Topic{"persistent", "public", "default", "orders", -1}, false},
		{"persistent://t/ns/orders-partition-3", Topic{"persistent", "t", "ns", "orders", 3}, false},
		{"t/ns/a-partition-1-partition-12", Topic{"persistent", "t", "ns", "a-partition-1", 12}, false},
		{"t/ns/orders-partition-01", Topic{"persistent", "t", "ns", "orders-partition-01", -1}, false},
		{"t/ns/orders-partition-+1", Topic{"persistent", "t", "ns", "orders-partition-+1", -1}, false},
		{"t/ns/orders-partition--1", Topic{"persistent", "t", "ns", "orders-partition--1", -1}, false},
		{"t/ns/orders-partition-x", Topic{"persistent", "t", "ns", "orders-partition-x", -1}, false},
		{"t/ns/orders-partition-", Topic{"persistent", "t", "ns", "orders-partition-", -1}, false},
		{"http://t/ns/x", Topic{}, true},
		{"persistent://t/cluster/ns/x", Topic{}, true},
		{"t/ns", Topic{}, true},
		{"t//x", Topic{}, true},
		{"persistent://orders", Topic{}, true},
		{"", Topic{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseTopic(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("ParseTopic(%q) = %+v, %v; want %+v, err=%v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestMatchFirstRuleWins(t *testing.T) {
	m, err := NewMatcher([]Rule[string]{
		{"public/default/orders-*", "orders"},
		{"non-persistent://public/*/*", "np-public"},
		{"public/*/*", "public"},
		{"*/*/*-dlq", "dlq"},
		{"*/*/*", "default"},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		topic     string
		want      string
		wantIndex int
	}{
		{"persistent://public/default/orders-eu", "orders", 0},
		{"persistent://public/default/orders-", "orders", 0},
		{"public/default/orders-eu-partition-7", "orders", 0},
		{"non-persistent://public/default/orders-eu", "orders", 0},
		{"non-persistent://public/other/x", "np-public", 1},
		{"persistent://public/other/x", "public", 2},
		{"orders", "public", 2}, // short name: public/default/orders, not "orders-*"
		{"acme/ns/payments-dlq", "dlq", 3},
		{"acme/ns/payments", "default", 4},
	}
	for _, tt := range tests {
		t.Run(tt.topic, func(t *testing.T) {
			got, i, ok := m.Match(tt.topic)
			if !ok || got != tt.want || i != tt.wantIndex {
				t.Errorf("Match(%q) = %q, %d, %v; want %q, %d", tt.topic, got, i, ok, tt.want, tt.wantIndex)
			}
		})
	}
}

func TestMatchNoRuleOrBadTopic(t *testing.T) {
	m, _ := NewMatcher([]Rule[int]{{"public/default/*", 1}})
	for _, topic := range []string{"acme/ns/x", "persistent://a/b/c/d", "bogus://public/default/x"} {
		if p, i, ok := m.Match(topic); ok || i != -1 || p != 0 {
			t.Errorf("Match(%q) = %d, %d, %v; want no match", topic, p, i, ok)
		}
	}
}

func TestMatcherValidation(t *testing.T) {
	tests := []struct {
		name      string
		rules     []string
		wantIndex int
		want      string
	}{
		{"two segments", []string{"a/b"}, 0, "has 2 segments"},
		{"four segments", []string{"ok/ok/ok", "a/b/c/d"}, 1, "has 4 segments"},
		{"empty segment", []string{"a//c"}, 0, "namespace segment is empty"},
		{"unknown domain", []string{"kafka://a/b/c"}, 0, "unknown domain"},
		{"control character", []string{"a/b/c\x00"}, 0, "control character"},
		{"names a partition", []string{"a/b/orders-partition-2"}, 0, "names a partition"},
		{"catch-all shadows later rule", []string{"*/*/*", "public/default/x"}, 1, "matched first by rule 0"},
		{"same pattern twice", []string{"a/b/c*", "x/y/z", "a/b/c*"}, 2, "matched first by rule 0"},
		{"domain-less rule shadows domain rule", []string{"a/*/c", "persistent://a/b/c"}, 1, "matched first by rule 0"},
		{"too long", []string{"a/b/" + strings.Repeat("x", maxSegmentLen+1)}, 0, "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules := make([]Rule[int], len(tt.rules))
			for i, p := range tt.rules {
				rules[i] = Rule[int]{Pattern: p, Policy: i}
			}
			_, err := NewMatcher(rules)
			var re *RuleError
			if !errors.As(err, &re) || re.Index != tt.wantIndex || !strings.Contains(re.Problem, tt.want) {
				t.Errorf("NewMatcher(%q) error = %v; want rule %d: %q", tt.rules, err, tt.wantIndex, tt.want)
			}
		})
	}
}

func TestMatcherReportsEveryBadRule(t *testing.T) {
	// Given a config with two broken rules among good ones
	rules := []Rule[int]{{"a/b/c", 0}, {"a/b", 1}, {"x/y/z", 2}, {"//", 3}}
	// When it is loaded
	_, err := NewMatcher(rules)
	// Then both are named
	if err == nil || !strings.Contains(err.Error(), "rule 1 ") || !strings.Contains(err.Error(), "rule 3 ") {
		t.Errorf("error = %v; want rules 1 and 3 named", err)
	}
}

func TestMatcherAllowsSpecificBeforeGeneral(t *testing.T) {
	// Given a specific rule before a general one, and a domain rule before a domain-less one
	rules := []Rule[int]{{"a/b/c", 0}, {"persistent://a/b/*", 1}, {"a/b/*", 2}, {"*/*/*", 3}}
	// When loaded
	_, err := NewMatcher(rules)
	// Then it is accepted
	if err != nil {
		t.Errorf("NewMatcher: %v", err)
	}
}

// globRegexp is an independent oracle for one segment.
func globRegexp(seg string) *regexp.Regexp {
	return regexp.MustCompile("^" + strings.ReplaceAll(regexp.QuoteMeta(seg), `\*`, `[^/]*`) + "$")
}

func FuzzMatch(f *testing.F) {
	f.Add("public/default/orders-*", "persistent://public/default/orders-1-partition-2")
	f.Add("*/*/*", "t/n/x")
	f.Add("non-persistent://a*b*/ns/*x*y", "non-persistent://aXXb/ns/axy")
	f.Add("a/b/**", "a/b/")
	f.Fuzz(func(t *testing.T, pattern, topic string) {
		m, err := NewMatcher([]Rule[int]{{pattern, 7}})
		if err != nil {
			if ParsePattern(pattern) == nil {
				t.Fatalf("NewMatcher refused %q but ParsePattern accepted it: %v", pattern, err)
			}
			return
		}
		p, i, ok := m.Match(topic)
		tp, perr := ParseTopic(topic)
		if perr != nil {
			if ok {
				t.Fatalf("unparsable topic %q matched", topic)
			}
			return
		}
		rest := pattern
		domainOK := true
		if d, r, found := strings.Cut(pattern, "://"); found {
			rest, domainOK = r, d == tp.Domain
		}
		segs := strings.Split(rest, "/")
		want := domainOK &&
			globRegexp(segs[0]).MatchString(tp.Tenant) &&
			globRegexp(segs[1]).MatchString(tp.Namespace) &&
			globRegexp(segs[2]).MatchString(tp.Local)
		if ok != want || (ok && (p != 7 || i != 0)) {
			t.Fatalf("Match(%q) with %q = %d, %d, %v; oracle says %v", topic, pattern, p, i, ok, want)
		}
	})
}

func FuzzParseTopic(f *testing.F) {
	f.Add("persistent://public/default/orders-partition-3")
	f.Add("t/ns/x-partition-01")
	f.Add("t/ns/a-partition-1-partition-12")
	f.Fuzz(func(t *testing.T, name string) {
		tp, err := ParseTopic(name)
		if err != nil {
			return
		}
		// The full name rebuilt from the parts parses to the same parts.
		full := tp.String()
		if tp.Partition >= 0 {
			full += fmt.Sprintf("-partition-%d", tp.Partition)
		}
		again, err := ParseTopic(full)
		if err != nil || again != tp {
			t.Fatalf("ParseTopic(%q) = %+v; rebuilt %q parses to %+v, %v", name, tp, full, again, err)
		}
	})
}

func BenchmarkMatch(b *testing.B) {
	m, _ := NewMatcher([]Rule[int]{
		{"public/default/orders-*", 0}, {"public/*/*", 1}, {"acme/*/pay*-dlq", 2}, {"*/*/*", 3},
	})
	b.ReportAllocs()
	for b.Loop() {
		sinkInt, _, _ = m.Match("persistent://acme/prod/payments-eu-dlq-partition-3")
	}
}
