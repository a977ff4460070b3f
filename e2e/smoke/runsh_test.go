package smoke

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// Given the repository as a newcomer has it,
// when the README's first command runs (RUN_EXIT_AFTER_DEMO=1 ./run.sh, on free ports, with a
// broker instance of its own),
// then it exits 0 and prints the side-by-side table with every workload's rows, the proxy's
// column showing each policy's effect (run.sh's demo fails on its own when it does not), and
// the elapsed time.
func TestRunShPrintsTheSideBySideTable(t *testing.T) {
	ports := make([]int, 4)
	for i := range ports {
		p, err := harness.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(harness.RepoRoot(), "run.sh"))
	cmd.Env = append(os.Environ(),
		"RUN_EXIT_AFTER_DEMO=1",
		fmt.Sprintf("PULSAR_INSTANCE=runsh-%d", ports[0]),
		fmt.Sprintf("PULSAR_BROKER_PORT=%d", ports[0]),
		fmt.Sprintf("PULSAR_WEB_PORT=%d", ports[1]),
		fmt.Sprintf("PROXY_LISTEN=127.0.0.1:%d", ports[2]),
		fmt.Sprintf("PROXY_METRICS=127.0.0.1:%d", ports[3]),
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run.sh: %v\n%s", err, out)
	}
	text := string(out)
	for _, want := range []string{"coalesce:", "properties:", "buckets:", "chunks:",
		"entries mixing regions", "keys delivered to both consumers", "chunks stored twice"} {
		if !strings.Contains(text, want) {
			t.Errorf("run.sh's output lacks %q:\n%s", want, text)
		}
	}
	elapsed := regexp.MustCompile(`the table above came (\d+) s after \./run\.sh started`).FindStringSubmatch(text)
	if elapsed == nil {
		t.Fatalf("run.sh printed no elapsed time:\n%s", text)
	}
	i := max(strings.Index(text, "what the broker stored"), 0)
	t.Logf("run.sh (the table after %s s):\n%s", elapsed[1], text[i:])
}
