package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
)

// Ports per broker, for clients whose service URL is the web port (http://
// or https://). Such a client looks a topic up over HTTP and connects to the
// broker URL the answer names, with a CONNECT that cannot name a target: the
// clients put no proxy_to_broker_url in it (Go, Java and the C++ client's
// HTTP lookup services all use the answer's URL as both the logical and the
// physical address). So the proxy opens one listener per configured broker
// (Config.BrokerPortsListen, and BrokerPortsTLSListen with TLS), rewrites
// HTTP lookup answers to name broker i's port on the proxy, and sends a
// CONNECT arriving there to broker i. These listeners run on the net.Conn
// transport (connside.go), as the TLS listener does.
//
// An answer naming a broker that has no port (not in Config.Brokers, by the
// host:port it is spelled with there) is not forwarded: the client gets 502
// and the log names the topic's path and the broker, since forwarding it
// would send the client around the proxy. An answer kind the proxy has no
// ports for (brokerUrlTls without BrokerPortsTLSListen, or brokerUrl
// without BrokerPortsListen) is removed from the answer for the same
// reason: a client needing it fails instead of bypassing the proxy.

// ErrUnmappedBroker means an HTTP lookup answer named a broker that has no
// port on the proxy (it is not one of the configured broker URLs).
var ErrUnmappedBroker = errors.New("HTTP lookup answer names a broker without a port on this proxy")

// lookupAnswerLimit bounds an HTTP lookup answer the proxy rewrites (a small
// JSON object).
const lookupAnswerLimit = 64 << 10

// brokerPort is one per-broker listener.
type brokerPort struct {
	broker string // the Config.Brokers address CONNECTs here go to
	tls    bool
	ln     net.Listener
	url    string // what rewritten lookup answers name
	// accepted counts the client connections accepted here (metrics).
	accepted atomic.Uint64
}

func (c *Config) validateBrokerPorts() error {
	for _, l := range []struct{ key, addr string }{{"broker-ports-listen", c.BrokerPortsListen}, {"broker-ports-tls-listen", c.BrokerPortsTLSListen}} {
		if l.addr == "" {
			continue
		}
		host, port, err := net.SplitHostPort(l.addr)
		if err != nil {
			return fmt.Errorf("%s: %q: %v", l.key, l.addr, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 0 || (p > 0 && p+len(c.Brokers)-1 > 65535) {
			return fmt.Errorf("%s: %q: port %s cannot start %d consecutive ports (one per broker-url)", l.key, l.addr, port, len(c.Brokers))
		}
		if c.WebListen == "" && c.WebTLSListen == "" {
			return fmt.Errorf("%s: needs web-listen or web-tls-listen (HTTP lookup answers there name these ports)", l.key)
		}
		if ip := net.ParseIP(host); c.AdvertisedHost == "" && (host == "" || (ip != nil && ip.IsUnspecified())) {
			return fmt.Errorf("%s: %q listens on every address: set advertised-host, the host clients reach the proxy at", l.key, l.addr)
		}
	}
	if c.BrokerPortsTLSListen != "" && (c.TLSCertFile == "" || c.TLSKeyFile == "") {
		return fmt.Errorf("broker-ports-tls-listen: needs tls-cert and tls-key")
	}
	return nil
}

// listenBrokerPorts opens the per-broker listeners and serves them. Called
// by Serve, before the engine starts.
func (s *Server) listenBrokerPorts() error {
	for _, l := range []struct {
		key, addr, scheme string
		tls               bool
	}{{"broker-ports-listen", s.cfg.BrokerPortsListen, "pulsar", false}, {"broker-ports-tls-listen", s.cfg.BrokerPortsTLSListen, "pulsar+ssl", true}} {
		if l.addr == "" {
			continue
		}
		host, port, _ := net.SplitHostPort(l.addr) // validated
		base, _ := strconv.Atoi(port)
		adv := s.cfg.AdvertisedHost
		if adv == "" {
			adv = host
		}
		for i, b := range s.cfg.Brokers {
			p := 0
			if base > 0 {
				p = base + i
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
			if err != nil {
				s.closeBrokerPorts()
				return fmt.Errorf("%s: the port for broker %s: %w", l.key, b, err)
			}
			_, actual, _ := net.SplitHostPort(ln.Addr().String())
			bp := &brokerPort{broker: b, tls: l.tls, ln: ln, url: l.scheme + "://" + net.JoinHostPort(adv, actual)}
			s.brokerPorts = append(s.brokerPorts, bp)
			go s.acceptLoop(ln, func(nc net.Conn) {
				bp.accepted.Add(1)
				s.serveNetConn(nc, bp.tls, bp.broker)
			})
		}
	}
	ports := s.brokerPorts
	s.m.brokerPorts.Store(&ports)
	if len(s.brokerPorts) > 0 {
		s.log.Info("ports per broker listening", "ports", s.BrokerPorts())
	}
	return nil
}

func (s *Server) closeBrokerPorts() {
	for _, bp := range s.brokerPorts {
		_ = bp.ln.Close()
	}
}

// BrokerPorts maps each "broker" (plaintext) or "broker tls" port to the URL
// HTTP lookup answers name for it. Any goroutine may call it once Addr
// returned.
func (s *Server) BrokerPorts() map[string]string {
	m := map[string]string{}
	for _, bp := range s.brokerPorts {
		k := bp.broker
		if bp.tls {
			k += " tls"
		}
		m[k] = bp.url
	}
	return m
}

// portURL returns the URL of the port for the broker addressed as plain or
// as tlsAddr (host:port, either may be ""), TLS or not; ok reports whether
// that broker has a port of either kind.
func (s *Server) portURL(plain, tlsAddr string, wantTLS bool) (url string, ok bool) {
	for _, bp := range s.brokerPorts {
		if bp.broker != plain && bp.broker != tlsAddr {
			continue
		}
		ok = true
		if bp.tls == wantTLS {
			return bp.url, true
		}
	}
	return "", ok
}

// rewriteHTTPLookup rewrites an HTTP lookup answer (LookupData: brokerUrl,
// brokerUrlTls, nativeUrl, httpUrl, httpUrlTls, brokerUrlSsl; other fields
// kept) so that its broker URLs name the broker's ports on the proxy.
//
// brokerUrl and brokerUrlTls are set whenever the proxy has a port of that
// kind, present in the answer or not: a plaintext broker omits brokerUrlTls
// (it sends only the legacy, always empty brokerUrlSsl), yet the proxy may
// offer TLS to clients in front of it. nativeUrl is rewritten only when
// present. brokerUrlSsl is left as the broker sent it (Pulsar always sends
// "", which old C++ clients require to be present).
func (s *Server) rewriteHTTPLookup(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		if json.Valid(body) && !bytes.HasPrefix(bytes.TrimSpace(body), []byte("{")) {
			// Not LookupData but another /lookup/ answer (a topic's bundle range is a JSON
			// string): it names no broker, so it goes on as it is.
			return body, nil
		}
		return nil, fmt.Errorf("answer is not a JSON object: %v", err)
	}
	str := func(k string) string {
		var v string
		if raw, ok := m[k]; ok {
			_ = json.Unmarshal(raw, &v)
		}
		return v
	}
	plain, tlsAddr := addrOf(str("brokerUrl")), addrOf(str("brokerUrlTls"))
	if plain == "" && tlsAddr == "" {
		return nil, fmt.Errorf("answer names no broker URL: %s", body)
	}
	for _, f := range []struct {
		key          string
		tls, ifThere bool
	}{{"brokerUrl", false, false}, {"nativeUrl", false, true}, {"brokerUrlTls", true, false}} {
		u, known := s.portURL(plain, tlsAddr, f.tls)
		if !known {
			return nil, fmt.Errorf("%w: %s / %s (it gets one when broker-url names it so)", ErrUnmappedBroker, str("brokerUrl"), str("brokerUrlTls"))
		}
		// Without a port of that kind the field is "" rather than absent: clients that
		// require it (the C++ client fails a lookup whose answer lacks brokerUrl, even over
		// TLS) keep parsing, and none is sent around the proxy.
		if _, present := m[f.key]; present || !f.ifThere {
			raw, _ := json.Marshal(u)
			m[f.key] = raw
		}
	}
	return json.Marshal(m)
}
