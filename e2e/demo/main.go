// Command demo shows, side by side, what the proxy changes: it runs the same small workloads
// directly against the broker and through the proxy, under the policy each one is for, and
// prints one table of what the broker stored (read back through its admin API) and what the
// consumers saw. run.sh runs it against the proxy it starts with e2e/demo/policies.yaml.
//
// The workloads (each on its own new topic; the proxy's rules match them by name):
//   - coalesce: unbatched asynchronous sends; the proxy merges them into fewer entries.
//   - properties: batched sends with a "region" property in runs; the proxy keeps each
//     entry to one region and stamps it as the entry's outer property (what a PIP-191 entry
//     filter reads).
//   - buckets: batched keyed sends to a Key_Shared subscription of default (AUTO_SPLIT)
//     consumers; directly, batches of mixed keys reach a consumer that does not own them.
//   - chunks: chunked messages through a relay that cuts the producer's connection after two
//     chunks, so the client resends them; the proxy drops the copies (PIP-295).
//
// It exits non-zero when a workload fails or the proxy's column does not show its policy's
// effect.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// env is what every workload needs: the two ways in, and the broker to read back.
type env struct {
	direct, proxy string // service URLs
	broker        *harness.Broker
	run           string // suffix of this run's topic names
	logger        log.Logger
}

func main() {
	proxyURL := flag.String("proxy", "pulsar://127.0.0.1:6650", "the proxy's service URL")
	brokerURL := flag.String("broker", "pulsar://127.0.0.1:16650", "the broker's service URL, for the direct column")
	adminURL := flag.String("admin", "http://127.0.0.1:18080", "the broker's admin URL, to read what it stored")
	flag.Parse()
	l := logrus.New()
	l.SetLevel(logrus.ErrorLevel)
	e := env{direct: *brokerURL, proxy: *proxyURL, broker: harness.Attach(*brokerURL, *adminURL, ""),
		run: fmt.Sprint(time.Now().Unix()), logger: log.NewLoggerWithLogrus(l)}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var t table
	failed := false
	for _, w := range workloads {
		fmt.Printf("demo: %s ...\n", w.title)
		rows, err := w.run(ctx, e)
		if err != nil {
			fmt.Fprintf(os.Stderr, "demo: %s: FAILED: %v\n", w.name, err)
			failed = true
			continue
		}
		t.section(w.name, w.title, rows)
		for _, r := range rows {
			if r.want != nil && !r.want(r.proxy) {
				fmt.Fprintf(os.Stderr, "demo: %s: through the proxy, %q is %s: not the policy's effect\n", w.name, r.what, r.proxy)
				failed = true
			}
		}
	}
	t.print(os.Stdout)
	if failed {
		os.Exit(1)
	}
}

// workload is one side-by-side comparison.
type workload struct {
	name, title string
	run         func(ctx context.Context, e env) ([]row, error)
}

var workloads = []workload{
	{"coalesce", fmt.Sprintf("%d unbatched asynchronous sends of one producer", coalesceMessages), coalesceRun},
	{"properties", fmt.Sprintf("%d batched sends, property region=us|eu|ap changing every %d", propertiesMessages, regionRun), propertiesRun},
	{"buckets", fmt.Sprintf("%d batched sends over %d keys, 2 default Key_Shared consumers", bucketsMessages, bucketsKeys), bucketsRun},
	{"chunks", fmt.Sprintf("%d chunked messages of %d chunks, the connection cut after %d chunks", chunkMessages, chunkCount, chunkCut), chunksRun},
}

// client opens a Pulsar client at url with the demo's quiet logger.
func (e env) client(url string) (pulsar.Client, error) {
	return pulsar.NewClient(pulsar.ClientOptions{URL: url, Logger: e.logger, OperationTimeout: 30 * time.Second})
}

// topic names a new topic of the workload for one column; the proxy's rules match the prefix.
func (e env) topic(workload, column string) string {
	return fmt.Sprintf("persistent://public/default/demo-%s-%s-%s", workload, column, e.run)
}
