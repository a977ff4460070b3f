package compat

import (
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/proxy"
)

var (
	updateReadme = flag.Bool("update-readme", false, "after a full run, also copy MATRIX.md into README.md between the compat-matrix markers")
	onlyDrivers  = flag.String("drivers", "", "comma-separated driver names (default: all); a partial run writes no MATRIX.md")
	parallel     = flag.Int("compat.parallel", 3, "drivers run at the same time")
)

func TestMain(m *testing.M) { os.Exit(harness.Run(m, harness.Options{})) }

// startProxy runs the proxy in-process in front of b (harness.StartProxy), logging at level and
// above to the returned buffer, and returns its pulsar:// URL and a function that stops it.
func startProxy(b *harness.Broker, level slog.Level) (string, *harness.LogBuffer, func(), error) {
	p, logs, err := startProxyWith(b, level, nil)
	if err != nil {
		return "", nil, nil, err
	}
	return p.URL, logs, p.Stop, nil
}

// startProxyWith is startProxy with the proxy's config changed by mod (nil: unchanged).
func startProxyWith(b *harness.Broker, level slog.Level, mod func(*proxy.Config)) (*harness.InProcessProxy, *harness.LogBuffer, error) {
	logs := &harness.LogBuffer{}
	p, err := harness.StartProxy(b.ServiceURL, func(c *proxy.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: level}))
		if mod != nil {
			mod(c)
		}
	})
	return p, logs, err
}

// packageDir is the directory of this package's sources.
func packageDir() string { return filepath.Join(harness.RepoRoot(), "e2e", "compat") }

const (
	readmeBegin = "<!-- compat-matrix:begin (generated: go test ./e2e/compat -run TestMatrix -update-readme) -->"
	readmeEnd   = "<!-- compat-matrix:end -->"
)

// splice returns readme with the text between the markers replaced by matrix.
func splice(readme, matrix string) (string, bool) {
	return spliceBetween(readme, matrix, readmeBegin, readmeEnd)
}

// spliceBetween returns readme with the text between begin and end replaced by matrix.
func spliceBetween(readme, matrix, begin, end string) (string, bool) {
	i := strings.Index(readme, begin)
	j := strings.Index(readme, end)
	if i < 0 || j < i {
		return readme, false
	}
	return readme[:i+len(begin)] + "\n" + matrix + readme[j:], true
}

// Given the README and the generated MATRIX.md,
// when the README's compat-matrix section is compared with MATRIX.md,
// then they are the same text (regenerate with -update-readme otherwise).
func TestReadmeMatchesMatrix(t *testing.T) {
	type generated struct{ file, begin, end string }
	all := []generated{{filepath.Join(packageDir(), "MATRIX.md"), readmeBegin, readmeEnd}}
	for _, v := range olderBrokers {
		begin, end := olderMarkers(v)
		all = append(all, generated{olderMatrixFile(v), begin, end})
	}
	readme, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range all {
		t.Run(filepath.Base(g.file), func(t *testing.T) {
			matrix, err := os.ReadFile(g.file)
			if err != nil {
				t.Fatalf("no generated matrix: %v", err)
			}
			want, ok := spliceBetween(string(readme), string(matrix), g.begin, g.end)
			if !ok {
				t.Fatalf("README.md has no %q ... %q markers", g.begin, g.end)
			}
			if want == string(readme) {
				return
			}
			wl, rl := strings.Split(want, "\n"), strings.Split(string(readme), "\n")
			i := 0
			for i < len(wl) && i < len(rl) && wl[i] == rl[i] {
				i++
			}
			got, exp := "<end>", "<end>"
			if i < len(rl) {
				got = rl[i]
			}
			if i < len(wl) {
				exp = wl[i]
			}
			t.Fatalf("README.md's compatibility matrix differs from %s at README line %d:\n  README: %.200s\n  MATRIX: %.200s\nrun: go test ./e2e/compat -run 'TestMatrix' -update-readme",
				g.file, i+1, got, exp)
		})
	}
}
