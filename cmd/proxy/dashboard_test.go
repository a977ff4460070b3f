package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// dashboard is the part of a Grafana dashboard JSON the check reads.
type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// Given the Grafana dashboard in deploy/grafana,
// when its queries are read,
// then every panel but a row has a title and a query with balanced brackets, and every metric a
// query names is one
// the proxy defines (a histogram's _bucket, _sum and _count series included), so the dashboard
// cannot drift from the code unnoticed.
func TestDashboardQueriesOnlyMetricsTheProxyExports(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "rebatchproxy.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("the dashboard is not valid JSON: %v", err)
	}
	defined := definedMetrics(t)
	name := regexp.MustCompile(`rebatchproxy_[a-z_]+`)
	used := map[string]bool{}
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || len(p.Targets) == 0 {
			t.Errorf("panel %q (%s) has no title or no query", p.Title, p.Type)
		}
		for _, tg := range p.Targets {
			if !balanced(tg.Expr) {
				t.Errorf("panel %q: unbalanced brackets in %s", p.Title, tg.Expr)
			}
			for _, m := range name.FindAllString(tg.Expr, -1) {
				base := m
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if s, ok := strings.CutSuffix(m, suffix); ok && defined[s] {
						base = s
					}
				}
				if !defined[base] {
					t.Errorf("panel %q queries %s, which the proxy does not define", p.Title, m)
				}
				used[base] = true
			}
		}
	}
	var unused []string
	for m := range defined {
		if !used[m] {
			unused = append(unused, m)
		}
	}
	sort.Strings(unused)
	t.Logf("%d panels; metrics not on the dashboard: %v", len(d.Panels), unused)
}

// definedMetrics returns the metric names the product's packages define: the string literals
// "rebatchproxy_..." in their non-test Go files.
func definedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	lit := regexp.MustCompile(`"(rebatchproxy_[a-z_]+)"`)
	out := map[string]bool{}
	for _, dir := range []string{".", "../../proxy", "../../rebatch", "../../chunkdedup", "../../keyshared"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
				out[m[1]] = true
			}
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d metric names found in the proxy's sources: the scan is broken", len(out))
	}
	return out
}

// balanced reports whether the (), {} and [] of a query nest properly outside its quoted strings.
func balanced(expr string) bool {
	var stack []rune
	inString := false
	for _, r := range expr {
		switch {
		case r == '"':
			inString = !inString
		case inString:
		case r == '(' || r == '{' || r == '[':
			stack = append(stack, r)
		case r == ')' || r == '}' || r == ']':
			open := map[rune]rune{')': '(', '}': '{', ']': '['}[r]
			if len(stack) == 0 || stack[len(stack)-1] != open {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return len(stack) == 0 && !inString
}
