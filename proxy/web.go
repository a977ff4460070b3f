package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// The web port, as Pulsar's proxy has one: the brokers' admin REST API
// (/admin/...) and HTTP lookups (/lookup/...) forwarded to the configured
// broker web service URLs (round robin, the next one when one cannot be
// reached), over HTTP and, with TLS configured, HTTPS; the admin API of
// Pulsar Functions, sources, sinks and workers goes to the functions
// workers instead when the proxy has their URLs (web_routes.go). Brokers answer
// requests for a topic another broker owns with a redirect to that broker;
// the proxy follows redirects to brokers it knows itself (their web hosts:
// the configured ones and the hosts of brokers learned from lookups) and to
// the configured functions workers, so the client only ever talks to the
// proxy. Other paths are refused (404); so is
// a redirect anywhere else (502). A request body of up to webReplayLimit is
// held, to be sent again when a broker redirects; a larger one (a function's
// or a package's upload) is streamed to one broker and not held, and a
// redirect of it is answered 502. Each request, redirects included, is bounded
// by Config.WebTimeout.
// HTTP lookup answers are forwarded unchanged, naming the brokers' own
// binary addresses, unless the proxy has ports per broker
// (Config.BrokerPortsListen): then they name those (broker_ports.go).

// webReplayLimit is the largest request body the web port holds to send again after a
// redirect. Pulsar's admin bodies are small JSON documents; uploads are larger.
const webReplayLimit = 10 << 20

// webRequestCost is what a request in flight holds besides its body, counted against
// webHeldBudget so that bodiless requests are bounded in number too: its goroutine, net/http's
// read and write buffers, the reverse proxy's copy buffer, headers.
const webRequestCost = 64 << 10

// webHeldBudget is how many bytes the web port's requests in flight may hold at once, the
// bodies they hold and webRequestCost each: a quarter of the memory budget, and at least one
// request holding a body of webReplayLimit (contract 7); no bound without a budget. A request
// that would not fit is answered 503 with Retry-After.
func webHeldBudget(memoryBudget int) int64 {
	if memoryBudget <= 0 {
		return math.MaxInt64
	}
	return max(webReplayLimit+1+webRequestCost, int64(memoryBudget)/4) // holdBody reads one byte over
}

// errStreamedRedirect means a broker redirected a request whose body the proxy streamed (over
// webReplayLimit) and so cannot send again.
var errStreamedRedirect = errors.New("a broker redirected a request whose body is over the size the proxy holds to send again after a redirect")

// webPrefixes are the paths forwarded (to brokers, or to functions workers: web_routes.go).
var webPrefixes = []string{"/admin/", "/lookup/"}

// webProxy forwards the web port's requests. Its methods are called by
// net/http on its own goroutines.
type webProxy struct {
	srv *Server
	// brokers and workers are the configured web targets: the brokers', and the functions
	// workers' (web_routes.go), often none.
	brokers, workers webRoute
	client           *http.Client
	// roleClient presents the proxy's certificate (web_auth.go); nil unless the proxy's
	// credential towards the brokers is its certificate.
	roleClient *http.Client
	rp         *httputil.ReverseProxy
	// held is the bytes reserved by requests in flight (webHeldBudget).
	held atomic.Int64
}

// reserve takes n bytes of the web port's budget, or reports false when they do not fit. Any
// goroutine may call it.
func (w *webProxy) reserve(n int64) bool {
	limit := webHeldBudget(w.srv.cfg.MemoryBudget)
	for {
		cur := w.held.Load()
		if cur+n > limit {
			return false
		}
		if w.held.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

func newWebProxy(srv *Server) (*webProxy, error) {
	w := &webProxy{srv: srv}
	var err error
	if w.brokers.targets, err = parseWebURLs("broker-web-url", srv.cfg.BrokerWebURLs); err != nil {
		return nil, err
	}
	if w.workers.targets, err = parseWebURLs("function-worker-web-url", srv.cfg.FunctionWorkerWebURLs); err != nil {
		return nil, err
	}
	plain, role, err := w.webTransports()
	if err != nil {
		return nil, err
	}
	w.client = &http.Client{Transport: plain, Timeout: srv.cfg.WebTimeout, CheckRedirect: w.checkRedirect}
	if role != nil {
		w.roleClient = &http.Client{Transport: role, Timeout: srv.cfg.WebTimeout, CheckRedirect: w.checkRedirect}
	}
	w.rp = &httputil.ReverseProxy{
		Rewrite:        func(*httputil.ProxyRequest) {}, // the target is set by ServeHTTP
		Transport:      roundTripFunc(w.roundTrip),
		ErrorHandler:   w.fail,
		ModifyResponse: w.rewriteLookupAnswer,
	}
	return w, nil
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// errRedirectRefused means a broker redirected to a host the proxy does not
// know, or too many times; another broker would answer the same.
var errRedirectRefused = errors.New("redirect not followed")

func (w *webProxy) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) > max(1, w.srv.cfg.MaxLookupRedirects) {
		return fmt.Errorf("%w: more than %d redirects", errRedirectRefused, max(1, w.srv.cfg.MaxLookupRedirects))
	}
	if !w.knownHost(req.URL) {
		return fmt.Errorf("%w: %s is not a known broker", errRedirectRefused, req.URL.Host)
	}
	if m := via[0].Method; m != http.MethodGet && m != http.MethodHead && req.Response != nil && req.Response.StatusCode < 307 {
		// net/http follows a 301, 302 or 303 without the body (a POST as a GET): the client
		// would get the answer to a request it did not make. Pulsar's brokers send 307.
		return fmt.Errorf("%w: the broker's %d would send the %s again without its body", errRedirectRefused, req.Response.StatusCode, m)
	}
	keepAuthorization(req, via)
	return nil
}

// keepAuthorization carries the first request's Authorization over a redirect. net/http drops
// it when the redirect goes to another host name (broker-1 to broker-2), which a broker of a
// cluster with authentication would answer 401; the target is a broker the caller checked, as
// Pulsar's own proxy carries it ("Ensure the Authorization header is carried over after a 307
// redirect from brokers").
func keepAuthorization(req *http.Request, via []*http.Request) {
	if a := via[0].Header.Get("Authorization"); a != "" && req.Header.Get("Authorization") == "" {
		req.Header.Set("Authorization", a)
	}
}

// knownHost reports whether u names a configured web URL's host:port (a broker's or a
// functions worker's) or the host of a broker the proxy may dial (configured or learned).
func (w *webProxy) knownHost(u *url.URL) bool {
	for _, g := range [...]*webRoute{&w.brokers, &w.workers} {
		for _, t := range g.targets {
			if t.Host == u.Host {
				return true
			}
		}
	}
	return w.srv.known.hasHost(u.Hostname())
}

// roundTrip sends r to the next broker (the next again if one cannot be
// reached), following redirects to known brokers; a functions path goes to the functions
// workers instead when the proxy has their URLs (web_routes.go), in the same way.
//
// A body over webReplayLimit is streamed, not held, so it is sent to one broker (whose redirect
// is answered 502). It too is offered to the next broker while one cannot be reached: net/http
// reads a body only once it has a connection, so none of it has gone. Once any connection was
// made (a redirect's target that cannot be dialled included), no other broker is tried.
func (w *webProxy) roundTrip(r *http.Request) (*http.Response, error) {
	body, stream, err := holdBody(r)
	if err != nil {
		return nil, err
	}
	route := w.routeOf(r.URL.Path)
	start := int(route.rr.Add(1))
	var lastErr error
	for i := range route.targets {
		out := w.outgoing(r, route.targets[(start+i)%len(route.targets)])
		var connected atomic.Bool // set on the transport's goroutine
		switch {
		case stream != nil:
			trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }}
			out = out.WithContext(httptrace.WithClientTrace(out.Context(), trace))
			out.Body, out.GetBody = io.NopCloser(stream), nil // NopCloser: a failed attempt must not close r.Body
		case body != nil:
			out.Body = io.NopCloser(bytes.NewReader(body))
			out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
			out.ContentLength = int64(len(body))
		}
		resp, err := w.clientFor(r).Do(out)
		if err != nil {
			lastErr = err
			if unreachable(err) && !connected.Load() {
				continue
			}
			// The broker answered or may have taken the request (a timeout, a reset after
			// sending): another broker would answer the same, or a POST would run twice.
			return nil, err
		}
		// Without GetBody net/http does not follow a 307 or 308 of a streamed body (they
		// resend the body) and returns it (checkRedirect refuses the others); the client must
		// not be sent to the broker it names (contract 6).
		if stream != nil && (resp.StatusCode == http.StatusTemporaryRedirect || resp.StatusCode == http.StatusPermanentRedirect) {
			resp.Body.Close()
			return nil, fmt.Errorf("%w (%d bytes)", errStreamedRedirect, webReplayLimit)
		}
		return resp, nil
	}
	return nil, lastErr
}

// outgoing is r as sent to broker t, without its body.
func (w *webProxy) outgoing(r *http.Request, t *url.URL) *http.Request {
	out := r.Clone(r.Context())
	out.URL.Scheme, out.URL.Host, out.Host = t.Scheme, t.Host, ""
	out.RequestURI = ""
	if w.rewritesLookups(r) {
		// The answer is rewritten: let the transport ask for and undo
		// any compression itself, so the body arrives as plain JSON.
		out.Header.Del("Accept-Encoding")
	}
	// The body is in hand or on its way: net/http already told the client to go on, and the
	// broker's own 100 Continue would reach it as a second one.
	out.Header.Del("Expect")
	return out
}

// mayHold is the most holdBody holds of a body of announced length n (-1: unknown), reserved
// before it reads: the body itself, nothing of one it streams, and for an unknown length what
// it reads to find out.
func mayHold(n int64) int64 {
	switch {
	case n > webReplayLimit:
		return 0
	case n < 0:
		return webReplayLimit + 1
	}
	return n
}

// holdBody reads r's body whole when it is at most webReplayLimit bytes (held, to be sent again
// after a redirect); a larger one, announced or found so, is returned as stream, what was read
// of it first followed by the rest. Both are nil for a request without a body.
func holdBody(r *http.Request) (held []byte, stream io.Reader, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil, nil
	}
	if r.ContentLength > webReplayLimit {
		return nil, r.Body, nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, webReplayLimit+1))
	if err != nil {
		return nil, nil, err
	}
	if len(b) <= webReplayLimit {
		return b, nil, nil
	}
	return nil, io.MultiReader(bytes.NewReader(b), r.Body), nil
}

// unreachable reports whether err means the request never reached a broker (the connection
// could not be made), so another broker may be tried.
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// rewritesLookups reports whether r is an HTTP lookup whose answer names
// ports per broker (Config.BrokerPortsListen, broker_ports.go).
func (w *webProxy) rewritesLookups(r *http.Request) bool {
	return len(w.srv.brokerPorts) > 0 && strings.HasPrefix(r.URL.Path, "/lookup/")
}

// rewriteLookupAnswer is the ReverseProxy's ModifyResponse: a successful
// HTTP lookup answer gets the proxy's per-broker ports as broker URLs. An
// error makes the client's answer 502 (fail logs it).
func (w *webProxy) rewriteLookupAnswer(resp *http.Response) error {
	if resp.StatusCode != http.StatusOK || !w.rewritesLookups(resp.Request) {
		return nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, lookupAnswerLimit+1))
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("reading the lookup answer: %w", err)
	}
	if len(body) > lookupAnswerLimit {
		return fmt.Errorf("lookup answer over %d bytes", lookupAnswerLimit)
	}
	out, err := w.srv.rewriteHTTPLookup(body)
	if err != nil {
		return err
	}
	resp.Body = io.NopCloser(bytes.NewReader(out))
	resp.ContentLength = int64(len(out))
	resp.Header.Set("Content-Length", strconv.Itoa(len(out)))
	resp.Header.Del("Content-Encoding")
	return nil
}

func (w *webProxy) fail(rw http.ResponseWriter, r *http.Request, err error) {
	w.srv.m.web[webBrokerError].Add(1)
	target := w.routeName(r.URL.Path)
	w.srv.log.Warn("web request not forwarded", "method", r.Method, "path", r.URL.Path, "client", r.RemoteAddr, "target", target, "reason", err.Error())
	http.Error(rw, "proxy: "+clientReason(err, target), http.StatusBadGateway)
}

// clientReason is what the client is told of err: the proxy's own reasons as they are, and of
// a failed exchange with a target (a *url.Error, which names the target's address: that stays
// in the log) only its kind. target is what the request went to: "broker" or "functions worker".
func clientReason(err error, target string) string {
	var ue *url.Error
	switch {
	case !errors.As(err, &ue):
		return err.Error()
	case errors.Is(err, errRedirectRefused):
		return "a " + target + " redirected the request in a way the proxy does not follow (to a host that is not a known broker or worker, too many times, or without its body)"
	case ue.Timeout():
		return "no answer from a " + target + " within the web timeout"
	case unreachable(err):
		return "no " + target + " could be reached"
	default:
		return "the exchange with the " + target + " failed"
	}
}

// ServeHTTP implements http.Handler.
func (w *webProxy) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	ok := false
	for _, p := range webPrefixes {
		ok = ok || strings.HasPrefix(r.URL.Path, p)
	}
	if !ok {
		w.srv.m.web[webRefused].Add(1)
		http.Error(rw, fmt.Sprintf("proxy: %s is not forwarded (only %s)", r.URL.Path, strings.Join(webPrefixes, ", ")), http.StatusNotFound)
		return
	}
	if !cleanPath(r.URL.Path) {
		// "/admin/../metrics" would pass the prefix check and reach what the broker serves
		// once it resolves the dots (contract 6: only the admin API and lookups).
		w.srv.m.web[webRefused].Add(1)
		w.srv.log.Warn("web request refused: a path with . or .. segments or empty ones", "method", r.Method, "path", r.URL.Path, "client", r.RemoteAddr)
		http.Error(rw, "proxy: a path with . or .. segments or empty ones is not forwarded", http.StatusBadRequest)
		return
	}
	r, ok = w.authorize(rw, r)
	if !ok {
		return
	}
	body := mayHold(r.ContentLength)
	need := body + webRequestCost
	if !w.reserve(need) {
		w.srv.m.web[webRefused].Add(1)
		w.srv.log.Warn("web request refused: requests in flight fill the web port's share of the memory budget",
			"method", r.Method, "path", r.URL.Path, "client", r.RemoteAddr, "body_bytes", body)
		rw.Header().Set("Retry-After", "1")
		http.Error(rw, "proxy: too many requests in flight; retry", http.StatusServiceUnavailable)
		return
	}
	defer w.held.Add(-need)
	if w.routeOf(r.URL.Path) == &w.workers {
		w.srv.m.web[webToWorker].Add(1)
	} else {
		w.srv.m.web[webForwarded].Add(1)
	}
	w.rp.ServeHTTP(rw, r)
}

// cleanPath reports whether p (decoded) has no ".", ".." or empty segment, a trailing slash
// aside: what the broker would serve is then what the prefix check saw.
func cleanPath(p string) bool {
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

// serveWeb starts the web listeners Config names (HTTP, and HTTPS with the
// TLS listener's certificate). Called by Serve.
func (s *Server) serveWeb() error {
	if s.cfg.WebListen == "" && s.cfg.WebTLSListen == "" {
		return nil
	}
	wp, err := newWebProxy(s)
	if err != nil {
		return err
	}
	start := func(addr string, tc *tls.Config) error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		if tc != nil {
			ln = tls.NewListener(ln, tc)
		}
		// net/http's own errors (refused TLS handshakes: no, an untrusted or an
		// expired client certificate; malformed requests) go to the proxy's log.
		// A request's body is read within WebTimeout (a client trickling it would hold a
		// goroutine and its buffer for ever); an idle keep-alive connection is closed after
		// IdleTimeout, as the binary port's.
		hs := &http.Server{Handler: wp, ReadHeaderTimeout: s.cfg.HandshakeTimeout, ReadTimeout: s.cfg.WebTimeout,
			IdleTimeout: s.cfg.IdleTimeout,
			ErrorLog:    slog.NewLogLogger(s.log.With("listener", "web").Handler(), slog.LevelWarn)}
		s.webServers = append(s.webServers, hs)
		s.webAddrs = append(s.webAddrs, ln.Addr().String())
		go func() { _ = hs.Serve(ln) }()
		return nil
	}
	if s.cfg.WebListen != "" {
		if err := start(s.cfg.WebListen, nil); err != nil {
			return fmt.Errorf("web-listen: %w", err)
		}
	}
	if s.cfg.WebTLSListen != "" {
		if err := start(s.cfg.WebTLSListen, s.tls.conf); err != nil {
			return fmt.Errorf("web-tls-listen: %w", err)
		}
	}
	return nil
}

// WebAddrs returns the addresses of the web listeners (HTTP first, then
// HTTPS, as configured). Any goroutine may call it once Addr returned.
func (s *Server) WebAddrs() []string { return s.webAddrs }

// stopWeb closes the web listeners and waits (within ctx) for requests.
func (s *Server) stopWeb(ctx context.Context) {
	for _, hs := range s.webServers {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = hs.Shutdown(c)
		cancel()
	}
}
