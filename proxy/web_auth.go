package proxy

import (
	"context"
	"net"
	"net/http"
	"strings"
)

// TLS client certificates on the HTTPS web port, as proxy_role.go does for the binary port.
//
// A client that authenticates to the admin API or an HTTP lookup with its TLS certificate
// (pulsar-admin --auth-plugin ...AuthenticationTls, a client with an https:// service URL and
// TLS authentication) cannot pass that certificate through a terminating proxy. With
// Config.BrokerClientAuth set, the HTTPS web port (which then requires a certificate trusted by
// TLSClientCAFile) forwards such a request, one that carries a verified certificate and no
// Authorization header of its own, with the proxy's credential (its broker-side certificate
// for "tls", so the broker web URLs must be https://; its token as "Authorization: Bearer" for
// "token") and the certificate's role (subject common name) in X-Original-Principal, the header
// Pulsar's brokers read from a proxy role (proxyRoles). A verified certificate without a common
// name is refused with 401.
//
// Every other request passes through with the client's own headers and no certificate from
// the proxy: the broker authenticates it as it would directly (a token, or nothing). In every
// case the client's own X-Original-Principal header is removed: only the proxy names a
// principal, or a client could speak for another.

// headerOriginalPrincipal is the header in which a proxy role names the client's role to the
// broker's web service.
const headerOriginalPrincipal = "X-Original-Principal"

// viaProxyRole marks a request's context when it is forwarded with the proxy's credential.
type viaProxyRole struct{}

// authorize applies the rules above to r in place. It returns false after answering the client
// (401). Called by ServeHTTP on net/http's goroutine for the request.
func (w *webProxy) authorize(rw http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	r.Header.Del(headerOriginalPrincipal)
	a := w.srv.cfg.BrokerClientAuth
	if a == nil || r.TLS == nil || r.Header.Get("Authorization") != "" {
		return r, true
	}
	role, verified := certRole(r.TLS.VerifiedChains)
	if !verified {
		return r, true
	}
	if role == "" {
		w.srv.m.web[webRefused].Add(1)
		w.srv.log.Warn("web request refused", "method", r.Method, "path", r.URL.Path, "client", r.RemoteAddr,
			"reason", "the client certificate has no subject common name to use as the role")
		http.Error(rw, "proxy: the client certificate has no subject common name to use as the role", http.StatusUnauthorized)
		return r, false
	}
	if a.Method == authMethodToken {
		tok, err := a.data()
		if err != nil {
			w.fail(rw, r, err)
			return r, false
		}
		r.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	r.Header.Set(headerOriginalPrincipal, role)
	return r.WithContext(context.WithValue(r.Context(), viaProxyRole{}, true)), true
}

// clientFor returns the HTTP client that sends r: the one presenting the proxy's certificate
// when authorize chose the proxy's "tls" credential, else the plain one. Any goroutine.
func (w *webProxy) clientFor(r *http.Request) *http.Client {
	if r.Context().Value(viaProxyRole{}) != nil && w.roleClient != nil {
		return w.roleClient
	}
	return w.client
}

// webTransports builds the transports towards the brokers' web services: plain (the brokers'
// trusted CAs and hostname check, no client certificate) and, when the proxy's credential is
// its certificate, one that also presents it. Called once by newWebProxy.
func (w *webProxy) webTransports() (plain, role *http.Transport, err error) {
	plain = http.DefaultTransport.(*http.Transport).Clone()
	plain.DialContext = (&net.Dialer{Timeout: w.srv.cfg.ConnectTimeout}).DialContext
	tc, err := loadBrokerTLS(&w.srv.cfg)
	if err != nil {
		return nil, nil, err
	}
	certs := tc.Certificates
	tc.Certificates = nil
	plain.TLSClientConfig = tc
	if a := w.srv.cfg.BrokerClientAuth; a == nil || a.Method != authMethodTLS {
		return plain, nil, nil
	}
	role = plain.Clone()
	rc := tc.Clone()
	rc.Certificates = certs
	role.TLSClientConfig = rc
	return plain, role, nil
}
