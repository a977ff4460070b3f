// Package fleet_test runs several proxy instances, behind HAProxy, in front of a real
// multi-broker Pulsar cluster (e2e/pulsar/cluster.sh: ZooKeeper, a bookie, two brokers), and
// breaks them: instances killed with -9 and restarted, topics moved between brokers, while
// producers of every policy, chunked ones among them, send. See README.md.
package fleet_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

var cluster *harness.Cluster

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	var c *harness.Cluster
	var err error
	if inst := os.Getenv("FLEET_CLUSTER_INSTANCE"); inst != "" {
		// A cluster started by hand (PULSAR_INSTANCE=inst e2e/pulsar/cluster.sh start), kept
		// between runs while working on these tests; stopped at the end like our own.
		c, err = harness.AttachCluster(inst, 2)
	} else {
		c, err = harness.StartCluster(fmt.Sprintf("fleet-%d", os.Getpid()), 2, false)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e/fleet: FAIL: no cluster: %v\n", err)
		return 1
	}
	cluster = c
	fmt.Fprintf(os.Stderr, "e2e/fleet: cluster %s, brokers %s\n", c.Name, c.ServiceURLs())
	code := m.Run()
	if os.Getenv("FLEET_CLUSTER_INSTANCE") != "" {
		return code
	}
	if err := c.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e/fleet: stopping the cluster: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
