package compat

import (
	"context"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rebatchproxy/rebatchproxy/e2e/drivers"
	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/proxy"
)

// httpLookup runs the two service-URL-on-the-web-port cells of one driver against a proxy of
// its own in front of the default broker: web ports (HTTP and HTTPS) forwarding to the broker's
// web service, and ports per broker (plaintext and TLS) that the rewritten lookup answers name.
//
//   - "http": the client's service URL is http://127.0.0.1:<web port>; it looks topics up over
//     HTTP and connects to the plaintext port per broker.
//   - "https": https://localhost:<web TLS port>, the test CA trusted and hostname verified; the
//     answer's brokerUrlTls names the TLS port per broker (pulsar+ssl://localhost:<port>).
//
// A cell passes when every send is acknowledged and every message delivered (roundTrip) and the
// proxy's port per broker of that kind accepted at least two connections (the producer's and
// the consumer's processes): a client that went around the proxy, straight to the broker the
// broker's answer names, would leave that count short. The proxy is private to the driver, so
// other rows' clients do not add to it.
func httpLookup(ctx context.Context, r *row, e *env) {
	p, _, err := startProxyWith(e.b, slog.LevelWarn, func(c *proxy.Config) {
		c.WebListen, c.WebTLSListen, c.BrokerWebURLs = "127.0.0.1:0", "127.0.0.1:0", []string{e.b.AdminURL}
		c.BrokerPortsListen, c.BrokerPortsTLSListen, c.AdvertisedHost = "127.0.0.1:0", "127.0.0.1:0", "localhost"
		c.TLSCertFile, c.TLSKeyFile = e.certs.ServerCert, e.certs.ServerKey
	})
	if err != nil {
		r.fail("http", "starting a proxy with web ports: %v", err)
		r.fail("https", "starting a proxy with web ports: %v", err)
		return
	}
	defer p.Stop()
	web := p.Server.WebAddrs()
	_, tlsPort, _ := net.SplitHostPort(web[1])
	for _, c := range []struct {
		col, url, ca, tls string
	}{
		{"http", "http://" + web[0], "", "false"},
		{"https", "https://localhost:" + tlsPort, e.certs.CA, "true"},
	} {
		roundTrip(ctx, r, c.col, drivers.ProduceSpec{URL: c.url, TLSTrustCerts: c.ca, Topic: topicName(r.d, c.col+"-lookup")}, "h")
		if r.status(c.col) == unsupported {
			continue // the client takes no http:// service URL: nothing reached the ports per broker
		}
		n, _ := harness.MetricSum(r.t, []prometheus.Collector{p.Server.Collector()}, "rebatchproxy_broker_port_connections_total", "tls", c.tls)
		if n < 2 {
			r.fail(c.col, "the proxy's ports per broker (tls=%s) accepted %v connections, want at least 2 (producer and consumer): the client bypassed the proxy", c.tls, n)
		}
	}
}
