package proxy

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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

// Given a web port in front of broker A, which redirects a topic's admin request to broker B
// under another host name (localhost against 127.0.0.1, as broker-1 against broker-2),
// when a client with a token POSTs to it, asking for 100 Continue,
// then B gets the token (net/http drops Authorization on a redirect to another host; a broker
// with authentication would answer 401) and no Expect of its own to answer.
func TestWebPortRedirectToAnotherHostKeepsTheToken(t *testing.T) {
	var gotAuth, gotExpect string
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth, gotExpect = r.Header.Get("Authorization"), r.Header.Get("Expect")
		io.WriteString(w, "ok")
	}))
	defer b.Close()
	bu, _ := url.Parse(b.URL)
	bLocal := "http://localhost:" + bu.Port()
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, bLocal+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer a.Close()
	_, web := startWebProxy(t, a.URL, bLocal)
	req, _ := http.NewRequest(http.MethodPost, web+"/admin/v2/persistent/t/n/x/subscription/s/skip_all", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer secret")
	req.Header.Set("Expect", "100-continue")

	resp, err := http.DefaultClient.Do(req)

	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || gotAuth != "Bearer secret" || gotExpect != "" {
		t.Fatalf("status %d; B got Authorization %q and Expect %q; want the token and no Expect", resp.StatusCode, gotAuth, gotExpect)
	}
}

// Given a web port in front of a broker,
// when a client asks for paths that leave /admin/ or /lookup/ once their dots are resolved,
// then each is refused with 400 and never reaches the broker; a path ending in a slash passes.
func TestWebPortRefusesDotSegments(t *testing.T) {
	var reached []string
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached = append(reached, r.URL.Path)
		io.WriteString(w, "ok")
	}))
	defer a.Close()
	_, web := startWebProxy(t, a.URL)
	for _, p := range []string{"/admin/../metrics", "/admin/v2/../../debug/pprof/", "/lookup/%2e%2e/metrics", "/admin/./v2/clusters", "/admin//v2/clusters"} {
		req, _ := http.NewRequest(http.MethodGet, web+"/x", nil)
		req.URL.Opaque = p // sent as written, dots and all

		resp, err := http.DefaultClient.Do(req)

		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", p, resp.StatusCode)
		}
	}
	if code, _ := get(t, http.MethodGet, web+"/admin/v2/tenants/", ""); code != http.StatusOK {
		t.Errorf("/admin/v2/tenants/: status %d", code)
	}
	if len(reached) != 1 {
		t.Fatalf("the broker was reached for %v; want only /admin/v2/tenants/", reached)
	}
}

// Given a web port in front of brokers A and B, where A takes a POST and does not answer
// within the web timeout,
// when a client POSTs through the web port,
// then it gets 502 and B never sees the request (A may have acted on it; sending it again
// elsewhere could run it twice).
func TestWebPortDoesNotResendARequestABrokerMayHaveTaken(t *testing.T) {
	var aGot, bGot atomic.Bool
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { bGot.Store(true) }))
	defer b.Close()
	release := make(chan struct{})
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		aGot.Store(true)
		<-release
	}))
	defer a.Close()
	defer close(release)
	fb := newFakeBroker(t)
	srv, _, _ := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.WebListen, c.BrokerWebURLs, c.WebTimeout = "127.0.0.1:0", []string{a.URL, b.URL}, 300*time.Millisecond
	})
	for i := 0; i < 4; i++ { // round robin: every other request starts at A
		aGot.Store(false)
		bGot.Store(false)

		code, _ := get(t, http.MethodPost, "http://"+srv.WebAddrs()[0]+"/admin/v2/persistent/t/n/x/subscription/s/skip_all", "{}")

		if aGot.Load() && bGot.Load() {
			t.Fatalf("the POST went to both brokers (status %d)", code)
		}
		if aGot.Load() && code == http.StatusBadGateway {
			return
		}
	}
	t.Fatal("no request went to A first")
}

// hashingBroker is a broker's web port that reads every request body whole and answers with its
// length and SHA-256 (hashOf).
func hashingBroker(t *testing.T) *httptest.Server {
	t.Helper()
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, _ := io.Copy(h, r.Body)
		fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
	}))
	t.Cleanup(b.Close)
	return b
}

// hashOf is what hashingBroker answers for a body of payload.
func hashOf(payload []byte) string { return fmt.Sprintf("%d %x", len(payload), sha256.Sum256(payload)) }

// upload POSTs payload to url (chunked: without announcing its length) and returns the status
// and the answer.
func upload(t *testing.T, url string, payload []byte, chunked bool) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(payload))
	if chunked {
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(payload)), -1
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(got)
}

// Given a web port in front of a broker that reads every upload whole,
// when a client uploads bodies over the size the proxy holds to resend (webReplayLimit), with
// their length announced or chunked,
// then each reaches the broker whole, byte for byte, and the client gets the broker's answer.
func TestWebPortStreamsABodyOverTheReplayLimit(t *testing.T) {
	_, web := startWebProxy(t, hashingBroker(t).URL)
	payload := bytes.Repeat([]byte("0123456789abcdef"), (3*webReplayLimit)/16+1)
	for _, chunked := range []bool{false, true} {

		code, got := upload(t, web+"/admin/v3/packages/function/t/n/p@v1", payload, chunked)

		if want := hashOf(payload); code != http.StatusOK || got != want {
			t.Fatalf("chunked %v: status %d, the broker read %q; want 200 and %q", chunked, code, got, want)
		}
	}
}

// Given a web port in front of two brokers, the first of which cannot be reached (nothing
// listens on its port),
// when a client uploads a body over the size the proxy holds to resend,
// then the upload goes whole to the other broker, whichever broker round robin tries first.
func TestWebPortStreamsABodyToTheNextBrokerWhenOneCannotBeReached(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close() // its port is free again: a dial there is refused
	_, web := startWebProxy(t, dead.URL, hashingBroker(t).URL)
	payload := bytes.Repeat([]byte("0123456789abcdef"), (2*webReplayLimit)/16+1)
	for i := 0; i < 2; i++ { // round robin: one of the two tries the dead broker first

		code, got := upload(t, web+"/admin/v3/packages/function/t/n/p@v1", payload, false)

		if want := hashOf(payload); code != http.StatusOK || got != want {
			t.Fatalf("upload %d: status %d, the broker read %q; want 200 and %q", i, code, got, want)
		}
	}
}

// Given a web port in front of broker A, which redirects every request to broker B, a broker
// the proxy knows,
// when a client uploads a body over the size the proxy holds to resend,
// then it gets 502 saying why, B never sees it, and the client is not sent to B either; a small
// body is still followed to B.
func TestWebPortAnswers502WhenABrokerRedirectsAStreamedBody(t *testing.T) {
	var bGot atomic.Int32
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bGot.Add(1)
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "from B")
	}))
	defer b.Close()
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Redirect(w, r, b.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer a.Close()
	fb := newFakeBroker(t)
	srv, _, _ := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.WebListen, c.BrokerWebURLs = "127.0.0.1:0", []string{a.URL, b.URL}
	})
	web := "http://" + srv.WebAddrs()[0] + "/admin/v3/packages/function/t/n/p@v1"
	// Round robin starts at A or B; A is the first broker of every other request.
	for i := 0; i < 2; i++ {
		bGot.Store(0)

		code, body := get(t, http.MethodPost, web, strings.Repeat("x", webReplayLimit+1))

		if bGot.Load() == 1 && code == http.StatusOK {
			continue // this one went to B first
		}
		if code != http.StatusBadGateway || !strings.Contains(body, "redirected") || bGot.Load() != 0 {
			t.Fatalf("status %d %q, B reached %d times; want 502 naming the redirect and B not reached", code, body, bGot.Load())
		}
		for j := 0; j < 2; j++ { // round robin: one of the two goes to A first
			if code, body := get(t, http.MethodPost, web+"?small", "{}"); code != http.StatusOK || body != "from B" {
				t.Fatalf("a small body: %d %q, want B's answer", code, body)
			}
		}
		return
	}
	t.Fatal("no upload went to A first")
}

// Contract 7 on the web port: given a proxy whose memory budget leaves room for 10 MiB of
// request bodies (and what the requests hold besides), and a broker that holds a first 6 MiB upload,
// when a second 6 MiB upload arrives meanwhile,
// then it is answered 503 with Retry-After instead of being read into memory, and once the
// first is answered the next one goes through.
func TestWebPortBoundsTheRequestBodiesItHolds(t *testing.T) {
	holding, hold := make(chan struct{}), make(chan struct{})
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Query().Get("hold") != "" {
			close(holding)
			<-hold
		}
		io.WriteString(w, "ok")
	}))
	defer a.Close()
	fb := newFakeBroker(t)
	srv, _, _ := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.WebListen, c.BrokerWebURLs, c.MemoryBudget = "127.0.0.1:0", []string{a.URL}, 4<<20
	})
	web := "http://" + srv.WebAddrs()[0] + "/admin/v3/packages/function/t/n/p@v1"
	body := strings.Repeat("x", 6<<20)
	first := make(chan int, 1)
	go func() {
		resp, err := http.Post(web+"?hold=1", "application/octet-stream", strings.NewReader(body))
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	select {
	case <-holding:
	case c := <-first:
		t.Fatalf("the first upload was answered %d before the broker held it", c)
	case <-time.After(10 * time.Second):
		t.Fatal("the first upload never reached the broker")
	}

	resp, err := http.Post(web, "application/octet-stream", strings.NewReader(body))

	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	close(hold)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("the second upload got %d (Retry-After %q) while the first was held, want 503 with Retry-After",
			resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if c := <-first; c != http.StatusOK {
		t.Fatalf("the first upload got %d", c)
	}
	if c, _ := get(t, http.MethodPost, web, body); c != http.StatusOK {
		t.Fatalf("an upload after the first was answered got %d", c)
	}
}

// Contract 7 on the web port, requests without a body: given a proxy whose memory budget leaves
// room for one 10 MiB request, a broker that holds a first 6 MiB upload, and then as many
// bodiless admin requests as the rest has room for (webRequestCost each), all held too,
// when one more bodiless request arrives,
// then it is answered 503 with Retry-After, and once the held ones are answered the next one
// goes through.
func TestWebPortBoundsTheRequestsItHolds(t *testing.T) {
	arrived, hold := make(chan struct{}, 256), make(chan struct{})
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Query().Get("hold") != "" {
			arrived <- struct{}{}
			<-hold
		}
		io.WriteString(w, "ok")
	}))
	defer a.Close()
	fb := newFakeBroker(t)
	const budget = 4 << 20
	srv, _, _ := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.WebListen, c.BrokerWebURLs, c.MemoryBudget = "127.0.0.1:0", []string{a.URL}, budget
	})
	web := "http://" + srv.WebAddrs()[0] + "/admin/v2/tenants"
	const upload = 6 << 20
	room := int((webHeldBudget(budget) - upload - webRequestCost) / webRequestCost)
	tr := &http.Transport{MaxIdleConnsPerHost: room + 2}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: time.Minute}
	answers := make(chan int, room+1)
	send := func(method string, body string) {
		req, _ := http.NewRequest(method, web+"?hold=1", strings.NewReader(body))
		resp, err := hc.Do(req)
		if err != nil {
			answers <- 0
			return
		}
		resp.Body.Close()
		answers <- resp.StatusCode
	}
	go send(http.MethodPost, strings.Repeat("x", upload))
	for i := 0; i <= room; i++ {
		if i > 0 {
			go send(http.MethodGet, "")
		}
		select {
		case <-arrived:
		case c := <-answers:
			t.Fatalf("request %d of %d was answered %d before the broker held it", i, room, c)
		case <-time.After(10 * time.Second):
			t.Fatalf("request %d of %d never reached the broker", i, room)
		}
	}

	c, _ := get(t, http.MethodGet, web, "")

	close(hold)
	if c != http.StatusServiceUnavailable {
		t.Fatalf("a bodiless request beyond the %d held got %d, want 503", room, c)
	}
	for i := 0; i <= room; i++ {
		if c := <-answers; c != http.StatusOK {
			t.Fatalf("a held request got %d", c)
		}
	}
	if c, _ := get(t, http.MethodGet, web, ""); c != http.StatusOK {
		t.Fatalf("a request after the held ones were answered got %d", c)
	}
}

// Given a web port in front of broker A, which answers a POST or a PUT with 302 to broker B, a
// broker the proxy knows (net/http would follow it without the body, the POST as a GET),
// when a client sends either through the web port,
// then it gets 502, and B never sees a request the client did not make.
func TestWebPortRefusesARedirectThatDropsTheBody(t *testing.T) {
	var bGot atomic.Int32
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bGot.Add(1)
		io.WriteString(w, "from B")
	}))
	defer b.Close()
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, b.URL+r.URL.Path, http.StatusFound)
	}))
	defer a.Close()
	_, web := startWebProxy(t, a.URL)
	for _, method := range []string{http.MethodPost, http.MethodPut} {

		code, body := get(t, method, web+"/admin/v2/tenants/x", "{}")

		if code != http.StatusBadGateway || bGot.Load() != 0 {
			t.Fatalf("%s: status %d %q, B reached %d times; want 502 and B not reached", method, code, body, bGot.Load())
		}
	}
}
