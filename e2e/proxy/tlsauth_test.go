package proxy_test

import (
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
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
// and an HTTPS web port (same certificates) forwarding to the broker's HTTPS web port,
// when clients with the certificates "client", "other" and an untrusted one each try to produce
// and consume 20 messages, and bin/pulsar-admin with each certificate lists public/default's
// topics, once directly on the broker's TLS ports and once through the proxy,
// then "client" gets its 20 messages back and its list both ways, "other" is refused by the
// broker's authorization both ways (through the proxy the broker judged the original principal,
// not the proxy's role), and the untrusted certificate is refused both ways.
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
		c.WebTLSListen, c.BrokerWebURLs = "127.0.0.1:0", []string{b.AdminURLTLS}
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	_, port, _ := net.SplitHostPort(px.Server.TLSAddr())
	_, webPort, _ := net.SplitHostPort(px.Server.WebAddrs()[0])
	paths := []struct{ name, url, admin string }{
		{"direct", b.ServiceURLTLS, b.AdminURLTLS},
		{"proxy", "pulsar+ssl://localhost:" + port, "https://localhost:" + webPort},
	}
	home, err := harness.PulsarHome(ctxT(t, 5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}

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
				out, adminErr := adminWithCert(t, home, path.admin, files.CA, c.cert, c.key, "topics", "list", "public/default")
				switch {
				case c.allowed && err != nil:
					t.Fatalf("refused: %v", err)
				case c.allowed && adminErr != nil:
					t.Fatalf("pulsar-admin refused: %v\n%s", adminErr, out)
				case !c.allowed && err == nil:
					t.Fatal("let in")
				case !c.allowed && adminErr == nil:
					t.Fatalf("pulsar-admin let in:\n%s", out)
				case err != nil:
					t.Logf("refused as expected: %v; pulsar-admin: %s", err, lastLine(out))
				}
			})
		}
	}
}

// adminWithCert runs bin/pulsar-admin against adminURL, authenticating with the TLS
// certificate cert/key and trusting ca (hostname verified).
func adminWithCert(t *testing.T, home, adminURL, ca, cert, key string, args ...string) (string, error) {
	base := []string{"--admin-url", adminURL, "--tls-trust-cert-path", ca, "--tls-enable-hostname-verification",
		"--auth-plugin", "org.apache.pulsar.client.impl.auth.AuthenticationTls",
		"--auth-params", "tlsCertFile:" + cert + ",tlsKeyFile:" + key}
	out, err := exec.CommandContext(ctxT(t, 2*time.Minute), filepath.Join(home, "bin", "pulsar-admin"), append(base, args...)...).CombinedOutput()
	return string(out), err
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
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
