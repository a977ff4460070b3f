package fleet_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/proxy"
)

// Given the cluster's brokers, which run no functions worker, a functions worker started apart
// from them (bin/pulsar functions-worker), and a proxy in front of both with its web port, the
// brokers' web URLs and the worker's (function-worker-web-url),
// when pulsar-admin from the distribution, pointed at the proxy's web port, creates a Java
// function (the distribution's ExclamationFunction: its jar is uploaded through the proxy),
// then pulsar-admin lists it and reports it running, through the proxy; messages a client sends
// to its input through the proxy's binary port come out of its output with "!" added, read
// through the proxy too; and a broker asked the same functions call directly refuses it (409:
// it runs no worker), so the proxy's answers came from the worker.
func TestFunctionsWorkerApartFromTheBrokersThroughTheWebPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	workerURL, err := cluster.StartFunctionsWorker(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the function's deletion (cleanups run last first)
		if err := cluster.StopFunctionsWorker(); err != nil {
			t.Errorf("stopping the functions worker: %v", err)
		}
	})
	home, err := harness.PulsarHome(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var brokers, webs []string
	for _, b := range cluster.Brokers {
		addr, err := proxy.BrokerAddress(b.ServiceURL)
		if err != nil {
			t.Fatal(err)
		}
		brokers, webs = append(brokers, addr), append(webs, b.AdminURL)
	}
	px, err := harness.StartProxy(cluster.Brokers[0].ServiceURL, func(c *proxy.Config) {
		c.Brokers = brokers
		c.WebListen, c.BrokerWebURLs, c.FunctionWorkerWebURLs = "127.0.0.1:0", webs, []string{workerURL}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	admin := func(args ...string) (string, error) {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // also after ctx, for the cleanup
		defer cancel()
		out, err := exec.CommandContext(c, filepath.Join(home, "bin", "pulsar-admin"),
			append([]string{"--admin-url", "http://" + px.Server.WebAddrs()[0]}, args...)...).CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("pulsar-admin %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	name := fmt.Sprintf("excl-%d", time.Now().UnixNano())
	in, out := "persistent://public/default/"+name+"-in", "persistent://public/default/"+name+"-out"
	fn := []string{"--tenant", "public", "--namespace", "default", "--name", name}
	t.Cleanup(func() {
		if o, err := admin(append([]string{"functions", "delete"}, fn...)...); err != nil {
			t.Logf("deleting the function: %v\n%s", err, o)
		}
	})

	created, err := admin(append([]string{"functions", "create",
		"--jar", filepath.Join(home, "examples", "api-examples.jar"),
		"--classname", "org.apache.pulsar.functions.api.examples.ExclamationFunction",
		"--inputs", in, "--output", out}, fn...)...)

	if err != nil {
		t.Fatal(err)
	}
	t.Logf("functions create through the proxy: %s", strings.TrimSpace(created))
	list, err := admin("functions", "list", "--tenant", "public", "--namespace", "default")
	if err != nil || !strings.Contains(list, name) {
		t.Fatalf("functions list through the proxy does not name %s: %v\n%s", name, err, list)
	}
	var status string
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(time.Second) {
		status, err = admin(append([]string{"functions", "status"}, fn...)...)
		if err == nil && strings.Contains(status, `"numRunning" : 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the function is not running 90 s after it was created: %v\n%s", err, status)
		}
	}

	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: px.URL, OperationTimeout: 30 * time.Second, Logger: plog.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	cons, err := client.Subscribe(pulsar.ConsumerOptions{Topic: out, SubscriptionName: "check",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	prod, err := client.CreateProducer(pulsar.ProducerOptions{Topic: in})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	const n = 10
	for i := range n {
		if _, err := prod.Send(ctx, &pulsar.ProducerMessage{Payload: fmt.Appendf(nil, "m%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]bool{}
	rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
	defer rcancel()
	for len(got) < n {
		m, err := cons.Receive(rctx)
		if err != nil {
			t.Fatalf("%d of %d outputs of the function read: %v", len(got), n, err)
		}
		got[string(m.Payload())] = true
		_ = cons.Ack(m)
	}
	for i := range n {
		if want := fmt.Sprintf("m%d!", i); !got[want] {
			t.Errorf("output %q missing; got %v", want, got)
		}
	}
	body, err := getBody(ctx, cluster.Brokers[0].AdminURL+"/admin/v3/functions/public/default")
	if err == nil || !strings.Contains(err.Error(), "HTTP 409") {
		t.Errorf("a broker asked for the functions list directly answered %v %s; want HTTP 409 (it runs no worker)", err, body)
	}
	t.Logf("status through the proxy: 1 instance running; a broker directly: %v", err)
}
