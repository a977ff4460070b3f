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

// Given a private broker with TLS client-certificate authentication and authorization on
// (proxyRoles=proxy; public/default open to the roles "proxy" and "client", not "other"), and a
// proxy whose TLS listener requires certificates from the test CA, speaking TLS to the broker
// with its own certificate "proxy" as its credential (broker-client-auth tls),
// when clients with the certificates "client", "other" and an untrusted one each try to produce
// and consume 20 messages, once directly on the broker's TLS port and once through the proxy,
// then "client" gets its 20 messages back both ways, "other" is refused by the broker's
// authorization both ways (through the proxy the broker judged the original principal, not the
// proxy's role), and the untrusted certificate is refused both ways.
func TestTLSClientCertificatesThroughTheProxyRole(t *testing.T) {
	files, b, tlsAddr := startTLSBroker(t, harness.Options{TLSAuth: true})
	for _, role := range []string{"proxy", "client"} {
		if err := b.GrantNamespacePermission(ctxT(t, 30*time.Second), "public/default", role, "produce", "consume"); err != nil {
			t.Fatalf("granting %s: %v", role, err)
		}
	}
	logs := &harness.LogBuffer{}
	px, err := harness.StartProxy(b.ServiceURL, func(c *proxy.Config) {
		c.Brokers = []string{tlsAddr}
		c.BrokerTLS, c.BrokerTLSTrustCertsFile = true, files.CA
		c.BrokerTLSCertFile, c.BrokerTLSKeyFile = files.ProxyCert, files.ProxyKey
		c.BrokerClientAuth = &proxy.BrokerClientAuth{Method: "tls"}
		c.TLSListen, c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile = "127.0.0.1:0", files.ServerCert, files.ServerKey, files.CA
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	_, port, _ := net.SplitHostPort(px.Server.TLSAddr())
	paths := []struct{ name, url string }{{"direct", b.ServiceURLTLS}, {"proxy", "pulsar+ssl://localhost:" + port}}

	for _, c := range []struct {
		name, cert, key string
		allowed         bool
	}{
		{"client", files.ClientCert, files.ClientKey, true},
		{"other", files.OtherClientCert, files.OtherClientKey, false},
		{"untrusted", files.UntrustedClientCert, files.UntrustedClientKey, false},
	} {
		for _, path := range paths {
			t.Run(c.name+"/"+path.name, func(t *testing.T) {
				err := roundTripWithCert(t, path.url, files.CA, c.cert, c.key, 20)
				switch {
				case c.allowed && err != nil:
					t.Fatalf("refused: %v", err)
				case !c.allowed && err == nil:
					t.Fatal("let in")
				case err != nil:
					t.Logf("refused as expected: %v", err)
				}
			})
		}
	}
}

// roundTripWithCert produces n messages with a client authenticating by its TLS certificate
// and consumes them back; it returns the first error.
func roundTripWithCert(t *testing.T, url, ca, cert, key string, n int) error {
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, TLSTrustCertsFilePath: ca, TLSValidateHostname: true,
		Authentication: pulsar.NewAuthenticationTLS(cert, key), OperationTimeout: 10 * time.Second,
		ConnectionTimeout: 5 * time.Second, Logger: quietLogger()})
	if err != nil {
		return err
	}
	defer client.Close()
	topic := uniqueTopic("tlsauth")
	cons, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	defer cons.Close()
	prod, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer prod.Close()
	for i := 0; i < n; i++ {
		if _, err := prod.Send(ctxT(t, 15*time.Second), &pulsar.ProducerMessage{Payload: []byte(fmt.Sprint(i))}); err != nil {
			return fmt.Errorf("send %d: %w", i, err)
		}
	}
	for i, m := range receiveN(t, n, cons) {
		if string(m.Payload()) != fmt.Sprint(i) {
			return fmt.Errorf("message %d is %q", i, m.Payload())
		}
	}
	return nil
}
