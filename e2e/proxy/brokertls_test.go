package proxy_test

import (
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/proxy"
)

// Given a private broker with a TLS port (certificates made now) and the proxy speaking TLS to it
// (trusting the test CA, hostname verified) with a TLS listener of its own,
// when a plaintext pulsar-client-go client and a pulsar+ssl:// one each produce 50 messages
// through the proxy and consume them,
// then all come back in order on both, the proxy's broker connections went to the broker's TLS
// port (its lookup answers name it), and no TLS handshake failed.
func TestBrokerTLSThroughTheProxy(t *testing.T) {
	files, b, tlsAddr := startTLSBroker(t, harness.Options{})
	logs := &harness.LogBuffer{}
	px, err := harness.StartProxy(b.ServiceURL, func(c *proxy.Config) {
		c.Brokers = []string{tlsAddr}
		c.BrokerTLS, c.BrokerTLSTrustCertsFile = true, files.CA
		c.TLSListen, c.TLSCertFile, c.TLSKeyFile = "127.0.0.1:0", files.ServerCert, files.ServerKey
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	_, tlsPort, _ := net.SplitHostPort(px.Server.TLSAddr())

	for _, c := range []struct {
		name string
		opts pulsar.ClientOptions
	}{
		{"plaintext client", pulsar.ClientOptions{URL: px.URL}},
		{"TLS client", pulsar.ClientOptions{URL: "pulsar+ssl://localhost:" + tlsPort, TLSTrustCertsFilePath: files.CA, TLSValidateHostname: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.opts.OperationTimeout, c.opts.ConnectionTimeout, c.opts.Logger = 15*time.Second, 5*time.Second, quietLogger()
			client, err := pulsar.NewClient(c.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			topic := uniqueTopic("brokertls")
			cons, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
			if err != nil {
				t.Fatal(err)
			}
			defer cons.Close()
			prod, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic})
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()

			for i := 0; i < 50; i++ {
				if _, err := prod.Send(ctxT(t, 15*time.Second), &pulsar.ProducerMessage{Payload: []byte(fmt.Sprint(i))}); err != nil {
					t.Fatalf("send %d: %v", i, err)
				}
			}
			got := receiveN(t, 50, cons)

			for i, m := range got {
				if string(m.Payload()) != fmt.Sprint(i) {
					t.Fatalf("message %d is %q", i, m.Payload())
				}
			}
		})
	}
	logs.WaitFor(t, "broker="+tlsAddr) // the data connections' log lines name the TLS address
}
