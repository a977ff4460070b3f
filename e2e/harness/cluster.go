package harness

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Cluster is a real Pulsar cluster on loopback started by e2e/pulsar/cluster.sh: ZooKeeper, a
// bookie and several brokers sharing them under one cluster name.
type Cluster struct {
	Name string
	// Brokers are the cluster's brokers, each with its own service and admin URL; any of them
	// answers for the whole cluster (lookups and admin calls are redirected to the owner).
	Brokers []*Broker
	env     []string
}

// StartCluster starts a fresh cluster of brokers brokers (instance name inst) and waits until
// every broker is ready and sees the others. The caller must Stop it.
func StartCluster(inst string, brokers int, dedup bool) (*Cluster, error) {
	env := append(os.Environ(), "PULSAR_INSTANCE="+inst, fmt.Sprintf("PULSAR_CLUSTER_BROKERS=%d", brokers),
		fmt.Sprintf("PULSAR_DEDUP=%t", dedup))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c := &Cluster{env: env}
	if err := c.script(ctx, "start"); err != nil {
		_ = c.Stop()
		return nil, err
	}
	if err := c.load(ctx, brokers); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

// AttachCluster returns the running cluster instance inst (started by cluster.sh, not by the
// caller) of brokers brokers.
func AttachCluster(inst string, brokers int) (*Cluster, error) {
	c := &Cluster{env: append(os.Environ(), "PULSAR_INSTANCE="+inst, fmt.Sprintf("PULSAR_CLUSTER_BROKERS=%d", brokers))}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c, c.load(ctx, brokers)
}

// vars returns what cluster.sh env prints, by name.
func (c *Cluster) vars(ctx context.Context) (map[string]string, error) {
	envCmd := exec.CommandContext(ctx, clusterScript(), "env")
	envCmd.Env = c.env
	out, err := envCmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s env: %w", clusterScript(), err)
	}
	vars := map[string]string{}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			vars[k] = v
		}
	}
	return vars, nil
}

// script runs cluster.sh with args for this cluster, its output on standard error.
func (c *Cluster) script(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, clusterScript(), args...)
	cmd.Env = c.env
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", clusterScript(), strings.Join(args, " "), err)
	}
	return nil
}

// load reads the cluster's URLs from cluster.sh env.
func (c *Cluster) load(ctx context.Context, brokers int) error {
	vars, err := c.vars(ctx)
	if err != nil {
		return err
	}
	c.Name = vars["PULSAR_CLUSTER_NAME"]
	svcs, webs := strings.Split(vars["PULSAR_BROKER_URLS"], ","), strings.Split(vars["PULSAR_ADMIN_URLS"], ",")
	if len(svcs) != brokers || len(webs) != brokers {
		return fmt.Errorf("%s env: %d service and %d admin URLs for %d brokers", clusterScript(), len(svcs), len(webs), brokers)
	}
	for i := range svcs {
		b := Attach(svcs[i], webs[i], "")
		b.Version = "cluster " + c.Name
		c.Brokers = append(c.Brokers, b)
	}
	return nil
}

// ServiceURLs is every broker's service URL, comma-separated (a proxy's broker-url).
func (c *Cluster) ServiceURLs() string {
	var u []string
	for _, b := range c.Brokers {
		u = append(u, b.ServiceURL)
	}
	return strings.Join(u, ",")
}

// Stop stops every process of the cluster and wipes its data.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return c.script(ctx, "stop")
}

func clusterScript() string { return filepath.Join(RepoRoot(), "e2e", "pulsar", "cluster.sh") }

// StartFunctionsWorker starts a functions worker apart from the cluster's brokers (which run
// none: cluster.sh sets functionsWorkerEnabled=false), as production clusters with separate
// workers run them (`bin/pulsar functions-worker`), and returns its web service URL once it
// serves. StopFunctionsWorker (or Stop, with the cluster) stops it. Functions run as threads inside the worker.
func (c *Cluster) StartFunctionsWorker(ctx context.Context) (string, error) {
	if err := c.script(ctx, "worker"); err != nil {
		return "", err
	}
	vars, err := c.vars(ctx)
	if err != nil {
		return "", err
	}
	if u := vars["PULSAR_FUNCTIONS_WORKER_URL"]; u != "" {
		return u, nil
	}
	return "", fmt.Errorf("%s env names no functions worker after %s worker", clusterScript(), clusterScript())
}

// StopFunctionsWorker stops the worker StartFunctionsWorker started; the cluster keeps running.
func (c *Cluster) StopFunctionsWorker() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return c.script(ctx, "stop-worker")
}
