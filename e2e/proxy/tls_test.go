package proxy_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/internal/testcert"
	"github.com/rebatchproxy/rebatchproxy/proxy"
)

// Given the proxy with a TLS listener (certificates made now) in front of the real broker
// (plaintext), and a pulsar-client-go client trusting the test CA, with hostname verification on,
// when it produces 100 messages to pulsar+ssl://localhost:<tls port> and consumes them there,
// then all 100 come back in order, the client's lookup and data connections both went through
// the proxy's TLS listener (the lookup answers name pulsar+ssl:// brokers), and no TLS
// handshake failed.
func TestGoClientOverTLSThroughTheProxy(t *testing.T) {
	b := harness.Default(t)
	files, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	px, err := harness.StartProxy(b.ServiceURL, func(c *proxy.Config) {
		c.TLSListen, c.TLSCertFile, c.TLSKeyFile = "127.0.0.1:0", files.ServerCert, files.ServerKey
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	_, port, _ := net.SplitHostPort(px.Server.TLSAddr())
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: "pulsar+ssl://localhost:" + port, TLSTrustCertsFilePath: files.CA,
		TLSValidateHostname: true, OperationTimeout: 15 * time.Second, ConnectionTimeout: 5 * time.Second, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	topic := uniqueTopic("tls")
	cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	prod, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()

	for i := 0; i < 100; i++ {
		if _, err := prod.Send(ctxT(t, 15*time.Second), &pulsar.ProducerMessage{Payload: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	got := receiveN(t, 100, cons)

	for i, m := range got {
		if string(m.Payload()) != fmt.Sprint(i) {
			t.Fatalf("message %d is %q", i, m.Payload())
		}
	}
	cs := []prometheus.Collector{px.Server.Collector()}
	open, _ := harness.MetricSum(t, cs, "rebatchproxy_connections_open", "side", "client")
	failures, _ := harness.MetricSum(t, cs, "rebatchproxy_tls_handshake_failures_total")
	t.Logf("client connections open through TLS: %v; TLS handshake failures: %v", open, failures)
	if open < 2 || failures != 0 {
		t.Errorf("client connections %v (want a lookup and a data connection at least), handshake failures %v", open, failures)
	}
}
