package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// lookupWeb is a broker web service answering every HTTP lookup with LookupData naming
// the broker at plain (and TLS at tlsAddr) host:port.
func lookupWeb(t *testing.T, plain, tlsAddr string) *httptest.Server {
	t.Helper()
	ws := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/lookup/v2/topic/") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"brokerUrl":"pulsar://%s","brokerUrlTls":"pulsar+ssl://%s","httpUrl":"http://b:8080","nativeUrl":"pulsar://%s"}`, plain, tlsAddr, plain)
	}))
	t.Cleanup(ws.Close)
	return ws
}

// Given a proxy with ports per broker in front of brokers A and B, whose web service
// answers HTTP lookups naming B,
// when a client looks a topic up over HTTP through the web port,
// then the answer's brokerUrl and nativeUrl name B's port on the proxy, brokerUrlTls (no TLS
// ports configured) is empty and the other fields are kept; and a CONNECT without
// proxy_to_broker_url on that port reaches B.
func TestHTTPLookupAnswersNameTheBrokersPortOnTheProxy(t *testing.T) {
	a, b := newFakeBroker(t), newFakeBroker(t)
	ws := lookupWeb(t, b.addr(), "tls.example:6651")
	srv, _, _ := startProxy(t, []string{a.addr(), b.addr()}, func(c *Config) {
		c.WebListen, c.BrokerWebURLs, c.BrokerPortsListen = "127.0.0.1:0", []string{ws.URL}, "127.0.0.1:0"
	})

	code, body := get(t, http.MethodGet, "http://"+srv.WebAddrs()[0]+"/lookup/v2/topic/persistent/t/n/x", "")

	var got map[string]string
	if code != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil {
		t.Fatalf("%d %q", code, body)
	}
	port := srv.BrokerPorts()[b.addr()]
	if port == "" || got["brokerUrl"] != port || got["nativeUrl"] != port || got["httpUrl"] != "http://b:8080" {
		t.Fatalf("answer %v; B's port %q (ports %v)", got, port, srv.BrokerPorts())
	}
	if tlsURL, ok := got["brokerUrlTls"]; !ok || tlsURL != "" {
		t.Errorf("brokerUrlTls without TLS ports: %v; want it present and empty (parsers require it; no client is sent around the proxy)", got)
	}
	c := dial(t, strings.TrimPrefix(port, "pulsar://"))
	send(t, c, frame(t, connectCmd("")))
	broker := b.accept(t)
	expect(t, broker, pulsarpb.BaseCommand_CONNECT)
	send(t, broker, frame(t, connectedCmd(1<<20)))
	expect(t, c, pulsarpb.BaseCommand_CONNECTED)
}

// Given a proxy with ports per broker in front of broker A, whose web service answers
// lookups naming a broker the proxy was not given,
// when a client looks a topic up over HTTP,
// then it gets 502 (the answer would send it around the proxy) and the log names the path and
// the broker.
func TestHTTPLookupNamingAnUnknownBrokerIsRefused(t *testing.T) {
	a := newFakeBroker(t)
	ws := lookupWeb(t, "other.example:6650", "other.example:6651")
	srv, _, logs := startProxy(t, []string{a.addr()}, func(c *Config) {
		c.WebListen, c.BrokerWebURLs, c.BrokerPortsListen = "127.0.0.1:0", []string{ws.URL}, "127.0.0.1:0"
	})

	code, body := get(t, http.MethodGet, "http://"+srv.WebAddrs()[0]+"/lookup/v2/topic/persistent/t/n/x", "")

	if code != http.StatusBadGateway || !strings.Contains(body, "other.example:6650") {
		t.Fatalf("%d %q", code, body)
	}
	logs.waitFor(t, "/lookup/v2/topic/persistent/t/n/x")
	logs.waitFor(t, ErrUnmappedBroker.Error())
}

// Given ports per broker with the TLS variant too,
// when a lookup answer names the broker by its TLS address only,
// then both URLs are rewritten to the broker's two ports.
func TestHTTPLookupRewritesTheTLSURLToTheTLSPort(t *testing.T) {
	srv := &Server{brokerPorts: []*brokerPort{
		{broker: "b1:6651", url: "pulsar://proxy:7000"},
		{broker: "b1:6651", tls: true, url: "pulsar+ssl://proxy:7100"},
	}}

	out, err := srv.rewriteHTTPLookup([]byte(`{"brokerUrl":"pulsar://b1:6650","brokerUrlTls":"pulsar+ssl://b1:6651","extra":1}`))

	if err != nil || string(out) != `{"brokerUrl":"pulsar://proxy:7000","brokerUrlTls":"pulsar+ssl://proxy:7100","extra":1}` {
		t.Fatalf("%s %v", out, err)
	}
}

// Given ports per broker of both kinds in front of a plaintext broker,
// when its lookup answer comes as Pulsar 4.0 sends it (no brokerUrlTls, the legacy
// brokerUrlSsl empty),
// then brokerUrlTls is added naming the broker's TLS port, and brokerUrlSsl is kept.
func TestHTTPLookupAddsTheTLSURLAPlaintextBrokerOmits(t *testing.T) {
	srv := &Server{brokerPorts: []*brokerPort{
		{broker: "127.0.0.1:6650", url: "pulsar://localhost:7000"},
		{broker: "127.0.0.1:6650", tls: true, url: "pulsar+ssl://localhost:7100"},
	}}

	out, err := srv.rewriteHTTPLookup([]byte(`{"brokerUrl":"pulsar://127.0.0.1:6650","httpUrl":"http://127.0.0.1:8080","nativeUrl":"pulsar://127.0.0.1:6650","brokerUrlSsl":""}`))

	want := `{"brokerUrl":"pulsar://localhost:7000","brokerUrlSsl":"","brokerUrlTls":"pulsar+ssl://localhost:7100","httpUrl":"http://127.0.0.1:8080","nativeUrl":"pulsar://localhost:7000"}`
	if err != nil || string(out) != want {
		t.Fatalf("got  %s %v\nwant %s", out, err, want)
	}
}

func TestBrokerPortsConfigIsValidated(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no web port", func(c *Config) { c.WebListen = "" }, "needs web-listen"},
		{"ports past 65535", func(c *Config) { c.BrokerPortsListen = "127.0.0.1:65535" }, "consecutive ports"},
		{"every address, no advertised host", func(c *Config) { c.BrokerPortsListen = "0.0.0.0:7000" }, "advertised-host"},
		{"TLS without a certificate", func(c *Config) { c.BrokerPortsTLSListen = "127.0.0.1:7100" }, "needs tls-cert"},
		{"every address with an advertised host", func(c *Config) { c.BrokerPortsListen, c.AdvertisedHost = ":7000", "proxy.example" }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Brokers = []string{"b1:6650", "b2:6650"}
			c.WebListen, c.BrokerWebURLs, c.BrokerPortsListen = "127.0.0.1:8080", []string{"http://b1:8080"}, "127.0.0.1:7000"
			tc.mod(&c)
			err := c.Validate()
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("%v; want %q", err, tc.want)
			}
		})
	}
}

// Given a proxy with ports per broker,
// when a client's CONNECT on broker A's port names another address in proxy_to_broker_url,
// then the allow-list still decides (DESIGN contract 6): ERROR(ServiceNotReady) and the
// connection closed, and A is not dialled.
func TestBrokerPortStillRefusesUnknownTargets(t *testing.T) {
	a := newFakeBroker(t)
	ws := lookupWeb(t, a.addr(), "")
	srv, _, _ := startProxy(t, []string{a.addr()}, func(c *Config) {
		c.WebListen, c.BrokerWebURLs, c.BrokerPortsListen = "127.0.0.1:0", []string{ws.URL}, "127.0.0.1:0"
	})
	c := dial(t, strings.TrimPrefix(srv.BrokerPorts()[a.addr()], "pulsar://"))

	send(t, c, frame(t, connectCmd("10.255.255.1:6650")))

	cmd, _ := expect(t, c, pulsarpb.BaseCommand_ERROR)
	if cmd.GetError().GetError() != pulsarpb.ServerError_ServiceNotReady {
		t.Errorf("got %v", cmd.GetError())
	}
	expectClosed(t, c)
	select {
	case <-a.conns:
		t.Error("proxy connected to broker A for a refused target")
	default:
	}
}

// Given ports per broker of the TLS kind only,
// when a lookup answer comes back,
// then brokerUrl is present and empty (the C++ client refuses an answer without it, even over
// TLS) and brokerUrlTls names the TLS port.
func TestHTTPLookupWithTLSPortsOnlyKeepsAnEmptyBrokerURL(t *testing.T) {
	srv := &Server{brokerPorts: []*brokerPort{{broker: "b1:6650", tls: true, url: "pulsar+ssl://proxy:7100"}}}

	out, err := srv.rewriteHTTPLookup([]byte(`{"brokerUrl":"pulsar://b1:6650","brokerUrlSsl":""}`))

	if err != nil || string(out) != `{"brokerUrl":"","brokerUrlSsl":"","brokerUrlTls":"pulsar+ssl://proxy:7100"}` {
		t.Fatalf("%s %v", out, err)
	}
}

// Given ports per broker,
// when a /lookup/ answer is not LookupData but a JSON string (GET .../bundle: the topic's
// bundle range, as pulsar-admin topics bundle-range asks),
// then it goes to the client unchanged instead of failing as a malformed lookup.
func TestHTTPLookupAnswerThatIsNotAnObjectPassesUnchanged(t *testing.T) {
	srv := &Server{brokerPorts: []*brokerPort{{broker: "b1:6650", url: "pulsar://proxy:7000"}}}

	out, err := srv.rewriteHTTPLookup([]byte(`"0x00000000_0x40000000"`))

	if err != nil || string(out) != `"0x00000000_0x40000000"` {
		t.Fatalf("%s %v", out, err)
	}
}
