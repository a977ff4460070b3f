package proxy

import (
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
)

// Where a web request goes. Pulsar's functions workers can run apart from the brokers (a
// cluster's brokers with functionsWorkerEnabled=false, and workers started with
// `bin/pulsar functions-worker`); the admin API of Pulsar Functions, sources, sinks and of the
// workers themselves is then served by the workers alone, and a broker answers it with an
// error. Pulsar's proxy sends those paths to its functionWorkerWebServiceURL; this one sends
// them to Config.FunctionWorkerWebURLs, round robin like the brokers' URLs, and everything
// else to the brokers. Without worker URLs every path goes to the brokers, which serve the
// functions API themselves when they run the worker.

// functionsResources are the resources of the admin API that the functions worker serves, as
// the first path segment after /admin or /admin/v2 or /admin/v3: the plural names of Pulsar's
// REST resources and the singular ones of its older clients, as Pulsar's proxy routes them.
var functionsResources = map[string]bool{
	"functions": true, "function": true,
	"sources": true, "source": true,
	"sinks": true, "sink": true,
	"worker": true, "worker-stats": true,
}

// isFunctionsPath reports whether p (a clean path) is a functions worker's admin path:
// /admin/R/..., /admin/v2/R/... or /admin/v3/R/... with R in functionsResources. p is the
// decoded path, the one cleanPath checked (Pulsar's proxy matches the raw one); a path spelled
// with encoded slashes may be routed differently from Pulsar's, but only ever to a configured
// worker or broker.
func isFunctionsPath(p string) bool {
	rest, ok := strings.CutPrefix(p, "/admin/")
	if !ok {
		return false
	}
	for _, v := range [...]string{"v2/", "v3/"} {
		if r, ok := strings.CutPrefix(rest, v); ok {
			rest = r
			break
		}
	}
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		rest = rest[:i]
	}
	return functionsResources[rest]
}

// webRoute is a group of web targets that requests go to round robin: the brokers, or the
// functions workers.
type webRoute struct {
	targets []*url.URL
	rr      atomic.Uint32
}

// parseWebURLs parses the configured web service URLs of flag (its name, for errors).
func parseWebURLs(flag string, urls []string) ([]*url.URL, error) {
	var out []*url.URL
	for _, u := range urls {
		pu, err := url.Parse(u)
		if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return nil, fmt.Errorf("%s: %q is not an http:// or https:// URL", flag, u)
		}
		out = append(out, pu)
	}
	return out, nil
}

// routeOf returns where a request for path p goes: the functions workers for a functions
// path when the proxy has worker URLs, the brokers otherwise. Any goroutine may call it.
func (w *webProxy) routeOf(p string) *webRoute {
	if len(w.workers.targets) > 0 && isFunctionsPath(p) {
		return &w.workers
	}
	return &w.brokers
}

// routeName names where a request for path p goes, for logs and answers.
func (w *webProxy) routeName(p string) string {
	if w.routeOf(p) == &w.workers {
		return "functions worker"
	}
	return "broker"
}
