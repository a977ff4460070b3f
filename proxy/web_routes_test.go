package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func TestFunctionsPathsAreTheWorkersAdminResources(t *testing.T) {
	for _, tc := range []struct {
		path string
		want bool
	}{
		{"/admin/v3/functions/public/default/f1", true},
		{"/admin/v3/functions/public/default", true},
		{"/admin/v2/functions/public/default/f1/status", true},
		{"/admin/functions/public/default/f1", true},
		{"/admin/v3/function/public/default/f1", true},
		{"/admin/v3/sources/public/default/s1", true},
		{"/admin/v3/source/public/default/s1", true},
		{"/admin/v3/sinks/builtinsinks", true},
		{"/admin/v3/sink/public/default/k1", true},
		{"/admin/v2/worker/cluster", true},
		{"/admin/v2/worker-stats/functionsmetrics", true},
		{"/admin/worker/cluster/leader", true},
		{"/admin/v3/functions", true},
		{"/admin/v2/persistent/public/default/functions", false}, // a topic named functions
		{"/admin/v2/tenants/functions", false},
		{"/admin/v2/namespaces/public/functions", false},
		{"/admin/v3/packages/function/public/default/p/v1", false}, // packages are the brokers'
		{"/admin/v2/workers", false},
		{"/admin/v2/functionsx/a", false},
		{"/admin/v4/functions/a", false},
		{"/lookup/v2/topic/persistent/public/default/functions", false},
		{"/admin", false},
		{"/admin/", false},
		{"/functions", false},
	} {
		if got := isFunctionsPath(tc.path); got != tc.want {
			t.Errorf("isFunctionsPath(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
}

// namedBackend answers every request with its name and the path, counting them.
func namedBackend(t *testing.T, name string, hits *atomic.Int64) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		body, _ := io.ReadAll(r.Body)
		io.WriteString(w, name+" "+r.Method+" "+r.URL.Path+" "+string(body))
	}))
	t.Cleanup(s.Close)
	return s
}

// Given a web port in front of a broker and a functions worker that runs apart from it
// (function-worker-web-url),
// when a client sends admin requests for functions, sources, sinks and the worker, and others,
// then the first go to the worker and the others to the broker, each answered by its target and
// counted by where it went.
func TestWebPortSendsTheFunctionsAPIToTheFunctionsWorkers(t *testing.T) {
	var brokerHits, workerHits atomic.Int64
	broker := namedBackend(t, "broker", &brokerHits)
	worker := namedBackend(t, "worker", &workerHits)
	fb := newFakeBroker(t)
	srv, _, _ := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.WebListen, c.BrokerWebURLs, c.FunctionWorkerWebURLs = "127.0.0.1:0", []string{broker.URL}, []string{worker.URL}
	})
	web := "http://" + srv.WebAddrs()[0]
	cases := []struct{ method, path, want string }{
		{http.MethodPost, "/admin/v3/functions/public/default/f1", "worker"},
		{http.MethodGet, "/admin/v3/sinks/builtinsinks", "worker"},
		{http.MethodGet, "/admin/v2/worker/cluster", "worker"},
		{http.MethodGet, "/admin/v2/tenants", "broker"},
		{http.MethodGet, "/admin/v2/persistent/public/default/functions/stats", "broker"},
		{http.MethodGet, "/lookup/v2/topic/persistent/public/default/t", "broker"},
	}

	var got []string
	for _, c := range cases {
		code, body := get(t, c.method, web+c.path, "b")
		got = append(got, strings.Join([]string{http.StatusText(code), body}, ": "))
	}

	for i, c := range cases {
		if want := "OK: " + c.want + " " + c.method + " " + c.path + " b"; got[i] != want {
			t.Errorf("%s %s: got %q, want %q", c.method, c.path, got[i], want)
		}
	}
	if brokerHits.Load() != 3 || workerHits.Load() != 3 {
		t.Errorf("broker got %d requests, worker %d; want 3 and 3", brokerHits.Load(), workerHits.Load())
	}
	if w, f := srv.m.web[webToWorker].Load(), srv.m.web[webForwarded].Load(); w != 3 || f != 3 {
		t.Errorf("counted %d forwarded to the worker and %d to the broker; want 3 and 3", w, f)
	}
}

// Given a web port with no functions worker configured,
// when a client sends a functions admin request,
// then it goes to the broker (which serves the functions API when it runs the worker itself).
func TestWebPortSendsTheFunctionsAPIToTheBrokersWithoutWorkers(t *testing.T) {
	var brokerHits atomic.Int64
	broker := namedBackend(t, "broker", &brokerHits)
	_, web := startWebProxy(t, broker.URL)

	code, body := get(t, http.MethodGet, web+"/admin/v3/functions/public/default", "")

	if code != http.StatusOK || body != "broker GET /admin/v3/functions/public/default " {
		t.Fatalf("%d %q", code, body)
	}
}

// Given two functions workers, both configured by the name localhost (which no broker the proxy
// knows has: its fake broker is 127.0.0.1), the first of which redirects a function's status to
// the second (where the instance runs, as Pulsar's workers do), and a third worker, configured
// too, that redirects to a host the proxy does not know,
// when a client asks the first two for the status through the web port, twice (round robin
// starts once at each), and then asks with only the third configured,
// then both first answers come from the second worker (the redirect to a configured worker is
// followed), and the last is answered 502 (the redirect elsewhere is not).
func TestWebPortFollowsAWorkersRedirectOnlyToAConfiguredWorker(t *testing.T) {
	var w2Hits, w1Hits atomic.Int64
	w2 := namedBackend(t, "worker2", &w2Hits)
	w2URL := strings.Replace(w2.URL, "127.0.0.1", "localhost", 1)
	w1 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w1Hits.Add(1)
		http.Redirect(w, r, w2URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer w1.Close()
	w3 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://192.0.2.1:6750"+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer w3.Close()
	var brokerHits atomic.Int64
	broker := namedBackend(t, "broker", &brokerHits)
	start := func(workers ...string) string {
		fb := newFakeBroker(t)
		srv, _, _ := startProxy(t, []string{fb.addr()}, func(c *Config) {
			c.WebListen, c.BrokerWebURLs, c.FunctionWorkerWebURLs = "127.0.0.1:0", []string{broker.URL}, workers
		})
		return "http://" + srv.WebAddrs()[0]
	}
	p := "/admin/v3/functions/public/default/f1/status"
	web := start(strings.Replace(w1.URL, "127.0.0.1", "localhost", 1), w2URL)
	webUnknown := start(w3.URL)

	var bodies []string
	for range 2 {
		code, body := get(t, http.MethodGet, web+p, "")
		bodies = append(bodies, http.StatusText(code)+": "+body)
	}
	unknownCode, _ := get(t, http.MethodGet, webUnknown+p, "")

	for _, b := range bodies {
		if b != "OK: worker2 GET "+p+" " {
			t.Errorf("got %q", b)
		}
	}
	if w1Hits.Load() != 1 || brokerHits.Load() != 0 {
		t.Errorf("worker1 got %d requests (want 1), the broker %d (want 0)", w1Hits.Load(), brokerHits.Load())
	}
	if unknownCode != http.StatusBadGateway {
		t.Errorf("a worker's redirect to an unknown host answered %d, want 502", unknownCode)
	}
}

func TestConfigRefusesFunctionWorkerURLsWithoutAWebPortOrMalformed(t *testing.T) {
	c := DefaultConfig()
	c.Brokers = []string{"127.0.0.1:6650"}
	c.FunctionWorkerWebURLs = []string{"http://127.0.0.1:6750"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "function-worker-web-url") {
		t.Errorf("without a web port: %v", err)
	}
	c.WebListen, c.BrokerWebURLs = "127.0.0.1:0", []string{"http://127.0.0.1:8080"}
	c.FunctionWorkerWebURLs = []string{"pulsar://127.0.0.1:6650"}
	fb := newFakeBroker(t)
	c.Brokers = []string{fb.addr()}
	srv, err := New(c)
	if err == nil {
		err = srv.Serve()
	}
	if err == nil || !strings.Contains(err.Error(), `function-worker-web-url: "pulsar://127.0.0.1:6650" is not an http:// or https:// URL`) {
		t.Errorf("a pulsar:// worker URL: %v", err)
	}
}
