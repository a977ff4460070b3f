package proxy

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// startWebProxy runs a proxy whose web port forwards to the broker web URLs given.
func startWebProxy(t *testing.T, brokerWeb ...string) (*Server, string) {
	t.Helper()
	fb := newFakeBroker(t)
	srv, _, _ := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.WebListen, c.BrokerWebURLs = "127.0.0.1:0", brokerWeb
	})
	return srv, "http://" + srv.WebAddrs()[0]
}

func get(t *testing.T, method, u, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Given a web port in front of broker A, which redirects a topic's admin request to broker B
// (another host the proxy knows: it is in its allowed brokers),
// when a client PUTs a body to that admin path through the web port,
// then the proxy follows the redirect itself (method and body kept) and the client gets B's answer.
func TestWebPortForwardsAdminAndFollowsBrokerRedirects(t *testing.T) {
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		io.WriteString(w, "B got "+r.Method+" "+r.URL.Path+" "+string(body))
	}))
	defer b.Close()
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, b.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer a.Close()
	bu, _ := url.Parse(b.URL)
	fb := newFakeBroker(t)
	srv, _, _ := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.WebListen, c.BrokerWebURLs = "127.0.0.1:0", []string{a.URL}
		c.AllowedBrokers = []string{net.JoinHostPort(bu.Hostname(), "6650")}
	})

	code, body := get(t, http.MethodPut, "http://"+srv.WebAddrs()[0]+"/admin/v2/persistent/t/n/x", `{"p":1}`)

	if code != http.StatusOK || body != `B got PUT /admin/v2/persistent/t/n/x {"p":1}` {
		t.Fatalf("%d %q", code, body)
	}
}

// Given a web port in front of a broker that redirects to a host the proxy does not know,
// when a client asks for an admin path, and for a path the web port does not forward,
// then the first gets 502 (the redirect is not followed) and the second 404, each counted.
func TestWebPortRefusesUnknownRedirectsAndOtherPaths(t *testing.T) {
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://192.0.2.1:8080"+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer a.Close()
	srv, web := startWebProxy(t, a.URL)

	code1, _ := get(t, http.MethodGet, web+"/admin/v2/tenants", "")
	code2, _ := get(t, http.MethodGet, web+"/metrics", "")

	if code1 != http.StatusBadGateway || code2 != http.StatusNotFound {
		t.Fatalf("redirect elsewhere: %d; other path: %d", code1, code2)
	}
	if srv.m.web[webBrokerError].Load() != 1 || srv.m.web[webRefused].Load() != 1 {
		t.Errorf("counted %d broker errors, %d refusals", srv.m.web[webBrokerError].Load(), srv.m.web[webRefused].Load())
	}
}
