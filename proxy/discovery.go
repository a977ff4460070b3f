package proxy

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// maxLearnedBrokers bounds the set of broker addresses learned from lookup
// answers. When full, the oldest learned entry is forgotten; a client that
// still holds it gets its data connection refused and looks up again.
const maxLearnedBrokers = 4096

// knownBrokers is the allow-list of data-connection targets (contract 6):
// configured addresses, which never expire, and addresses learned from
// LOOKUP_RESPONSE frames of real brokers. Safe for concurrent use.
type knownBrokers struct {
	mu      sync.RWMutex
	fixed   map[string]struct{}
	learned map[string]struct{}
	order   []string // learned addresses, oldest first
	// rr picks the next service broker for lookup connections.
	rr       atomic.Uint32
	services []string
}

func newKnownBrokers(services, allowed []string) *knownBrokers {
	k := &knownBrokers{fixed: map[string]struct{}{}, learned: map[string]struct{}{}, services: services}
	for _, a := range services {
		k.fixed[a] = struct{}{}
	}
	for _, a := range allowed {
		k.fixed[a] = struct{}{}
	}
	return k
}

// allowed reports whether addr (host:port) may be dialled.
func (k *knownBrokers) allowed(addr string) bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	if _, ok := k.fixed[addr]; ok {
		return true
	}
	_, ok := k.learned[addr]
	return ok
}

// hasHost reports whether host is the host of an address that may be
// dialled (the web port follows broker redirects to such hosts only).
func (k *knownBrokers) hasHost(host string) bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	for _, m := range []map[string]struct{}{k.fixed, k.learned} {
		for a := range m {
			if h, _, err := net.SplitHostPort(a); err == nil && h == host {
				return true
			}
		}
	}
	return false
}

// learn records a broker address from a lookup answer ("": none, ignored).
func (k *knownBrokers) learn(addr string) {
	if addr == "" || k.allowed(addr) {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.learned[addr]; ok {
		return
	}
	if len(k.order) >= maxLearnedBrokers {
		delete(k.learned, k.order[0])
		k.order = k.order[1:]
	}
	k.learned[addr] = struct{}{}
	k.order = append(k.order, addr)
}

func (k *knownBrokers) count() int {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return len(k.fixed) + len(k.learned)
}

// nextService returns the i-th service broker after the round-robin cursor.
func (k *knownBrokers) nextService(start uint32, i int) string {
	return k.services[(int(start)+i)%len(k.services)]
}

// rewriteLookupResponse implements the one rewrite of the transparent proxy.
// A LOOKUP_RESPONSE of type Connect or Redirect is re-encoded with
// proxy_through_service_url=true, so the client keeps talking to the proxy
// and names the broker in proxy_to_broker_url; the broker's address is
// learned. Every other field, unknown ones included, is kept. It appends
// the new frame to dst; learnedAddr is the address learned ("" if none) and
// result the lookup-metrics index. For a TLS client (tlsClient), the answer
// also gets brokerServiceUrlTls (tlsURLFor), the URL such a client names.
// With TLS to brokers (tlsBrokers), the broker's TLS address is the one
// named and learned (setBrokerTLSURLs).
func rewriteLookupResponse(dst []byte, f wire.Frame, cmd *pulsarpb.BaseCommand, tlsClient, tlsBrokers bool) (out []byte, learnedAddr string, result int, err error) {
	if err := wire.DecodeCommand(f, cmd); err != nil {
		return dst, "", lookupFailed, err
	}
	r := cmd.GetLookupTopicResponse()
	if r == nil {
		return dst, "", lookupFailed, wire.ErrMalformedCommand
	}
	switch r.GetResponse() {
	case pulsarpb.CommandLookupTopicResponse_Connect:
		result = lookupConnect
	case pulsarpb.CommandLookupTopicResponse_Redirect:
		result = lookupRedirect
	default:
		return append(dst, f.Bytes()...), "", lookupFailed, nil
	}
	learnedAddr = throughProxy(r, tlsClient, tlsBrokers)
	out, err = wire.AppendCommandFrame(dst, cmd)
	return out, learnedAddr, result, err
}

// throughProxy rewrites a Connect or Redirect answer so the client comes
// back through the proxy (proxy_through_service_url=true) naming a broker
// address the proxy dials: the broker's TLS address with TLS to brokers, and
// for a TLS client a pulsar+ssl:// URL as well. It returns that address.
func throughProxy(r *pulsarpb.CommandLookupTopicResponse, tlsClient, tlsBrokers bool) (addr string) {
	addr = addrOf(r.GetBrokerServiceUrl())
	if tlsBrokers {
		if a := setBrokerTLSURLs(r); a != "" {
			addr = a
		}
	}
	t := true
	r.ProxyThroughServiceUrl = &t
	if tlsClient {
		setTLSURL(r, addr)
	}
	return addr
}

// setTLSURL gives a TLS client's lookup answer the broker URL it will name in
// proxy_to_broker_url: pulsar+ssl:// with the broker's plaintext address
// (addr), which the proxy dials in plaintext (BrokerAddress maps it back).
// Pulsar clients with TLS on take brokerServiceUrlTls from an answer; a
// broker without TLS gives none, and a broker's own TLS port is not what
// the proxy dials.
func setTLSURL(r *pulsarpb.CommandLookupTopicResponse, addr string) {
	if addr == "" {
		return
	}
	u := "pulsar+ssl://" + addr
	r.BrokerServiceUrlTls = &u
}
