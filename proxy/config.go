package proxy

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rebatchproxy/rebatchproxy/keyshared"
	"github.com/rebatchproxy/rebatchproxy/wire"
)

// Config is everything a Server needs. The zero value is not usable; start
// from DefaultConfig. A Config is read-only once passed to New.
type Config struct {
	// Listen is the client-facing TCP address, host:port.
	Listen string
	// Brokers are the cluster's service addresses (host:port). A connection
	// whose CONNECT names no proxy_to_broker_url (a lookup connection) goes
	// to one of them, round robin, trying the next on a dial error.
	Brokers []string
	// AllowedBrokers are extra host:port targets a data connection may name
	// in proxy_to_broker_url besides Brokers and the brokers learned from
	// lookup answers (contract 6).
	AllowedBrokers []string

	// ConnectTimeout bounds the TCP dial to a broker.
	ConnectTimeout time.Duration
	// HandshakeTimeout bounds the time from accepting a client until the
	// broker's CONNECTED has been relayed.
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection pair after no byte moved either way
	// for this long; 0 disables it. Pulsar clients ping every 30 s.
	IdleTimeout time.Duration

	// MaxMessageSize bounds frames before the broker's CONNECTED tells the
	// real limit (frames may be MaxMessageSize+10 KiB, as brokers allow).
	MaxMessageSize int
	// SoftBufferLimit: when the bytes queued towards one side exceed it,
	// the proxy stops taking frames from the other side until they drain.
	SoftBufferLimit int
	// MemoryBudget is the proxy's memory target. Half of it bounds the bytes
	// all connections together hold (unread input and output queued towards
	// slow sides): above that, every direction pauses once 256 KiB are
	// queued towards its receiver (instead of SoftBufferLimit), so the slow
	// ones are slowed harder and the fast ones, whose queues stay empty, go
	// on. The other half is headroom for garbage not yet collected and
	// per-connection state (cmd/proxy sets Go's memory limit to the budget).
	// 0 disables it.
	MemoryBudget int
	// HardBufferLimit: when the bytes held for one direction (unread input
	// plus queued output) exceed it, the pair is closed with a logged reason.
	HardBufferLimit int
	// MaxConcurrentLookups bounds LOOKUP and PARTITIONED_METADATA requests in
	// flight across all connections; excess ones are answered with
	// TooManyRequests, as Pulsar's proxy does.
	MaxConcurrentLookups int
	// MaxConnectionLookups bounds the lookups in flight from one client
	// connection, under MaxConcurrentLookups, so a client flooding lookups is
	// refused its own excess (TooManyRequests) and nobody else's.
	MaxConnectionLookups int
	// MaxLookupRedirects is how many Redirect answers to one client LOOKUP
	// the proxy follows itself, asking each named broker in turn, before it
	// answers the client Failed(ServiceNotReady). 0 relays Redirect answers
	// to the client (with proxy_through_service_url=true) instead. The
	// default, 20, is the Java client's maxLookupRedirects.
	MaxLookupRedirects int
	// LookupTimeout bounds following one client LOOKUP's redirects, all hops
	// included (dial, handshake and lookup on each).
	LookupTimeout time.Duration
	// DrainTimeout is how long Shutdown waits for connections to end.
	DrainTimeout time.Duration

	// EventLoops is the number of gnet event loops; 0 means one per P
	// (GOMAXPROCS). Serve raises a GOMAXPROCS of 1 to 2 unless the
	// environment sets it (procs.go).
	EventLoops int
	// ReadBufferCap is gnet's per-loop read buffer size.
	ReadBufferCap int

	// TLSListen is the host:port of the client-facing TLS listener
	// (pulsar+ssl:// clients); "" means none. Its sessions run on the
	// net.Conn transport; brokers are dialled as BrokerTLS says.
	TLSListen string
	// TLSCertFile and TLSKeyFile are the listener's certificate chain and
	// key (PEM), required with TLSListen and re-read by Server.ReloadTLS.
	TLSCertFile, TLSKeyFile string
	// TLSClientCAFile, when set, makes the TLS listener require a client
	// certificate signed by one of the PEM certificates in it.
	TLSClientCAFile string

	// BrokerTLS makes every broker connection TLS (broker-url pulsar+ssl://):
	// brokers are dialled at their TLS addresses (broker_tls.go), with
	// BrokerTLSTrustCertsFile's CAs (the system's if empty), the hostname
	// verified unless BrokerTLSNoHostnameVerification, and the client
	// certificate BrokerTLSCertFile/BrokerTLSKeyFile if given.
	BrokerTLS                                                    bool
	BrokerTLSTrustCertsFile, BrokerTLSCertFile, BrokerTLSKeyFile string
	BrokerTLSNoHostnameVerification                              bool
	// BrokerClientAuth, when set, is the proxy's own credential towards the brokers for
	// clients that authenticate with a TLS certificate (auth method "tls"): the proxy
	// verifies the certificate and connects as a proxy role, naming the client's role in
	// original_principal (proxy_role.go). Needs TLSListen and TLSClientCAFile.
	BrokerClientAuth *BrokerClientAuth

	// WebListen is the host:port of the web port (HTTP): the brokers' admin
	// REST API and HTTP lookups, forwarded to BrokerWebURLs; "" means none.
	WebListen string
	// WebTLSListen is the same over HTTPS, with the TLS certificate
	// (TLSCertFile, TLSKeyFile; TLSClientCAFile applies too); "" means none.
	WebTLSListen string
	// BrokerWebURLs are the brokers' web service URLs (http:// or https://),
	// required with a web port; requests go to them round robin.
	BrokerWebURLs []string
	// FunctionWorkerWebURLs are the web service URLs of functions workers that
	// run apart from the brokers (http:// or https://): the Pulsar Functions,
	// sources, sinks and worker admin paths go to them (round robin) instead of
	// to the brokers, as Pulsar's proxy does with functionWorkerWebServiceURL
	// (web_routes.go). Empty: every admin path goes to the brokers (which serve
	// those paths themselves when they run the worker).
	FunctionWorkerWebURLs []string
	// WebTimeout bounds one web request, redirects followed included.
	WebTimeout time.Duration

	// BrokerPortsListen (host:port), when set, opens one client-facing
	// listener per broker in Brokers, on consecutive ports from port (0: any
	// free ports), for clients whose service URL is the web port (HTTP
	// lookups): they connect to the broker URL a lookup answer names and
	// cannot name a target to a proxy, so HTTP lookup answers name broker
	// i's port here, and a CONNECT there goes to broker i (broker_ports.go).
	BrokerPortsListen string
	// BrokerPortsTLSListen is the same over TLS (the TLS listener's
	// certificate and client CA), named in answers' brokerUrlTls.
	BrokerPortsTLSListen string
	// AdvertisedHost is the host HTTP lookup answers name for those ports;
	// "" means the listen address's host, which must then be a real one.
	AdvertisedHost string

	// ManagedKeyShared, when set, names the topics whose unaligned Key_Shared subscriptions
	// the proxy manages (keyshared.go): it returns the topic's bucket ring, or nil for a topic
	// left alone. Called on event loops for each Key_Shared SUBSCRIBE.
	ManagedKeyShared func(topic string) keyshared.Ring
	// HandoffTimeout bounds how long a managed Key_Shared consumer being released may take to
	// acknowledge what it was sent before the proxy closes it anyway (keyshared contract 3).
	HandoffTimeout time.Duration
	// KeySharedAwayTimeout is how long a released consumer keeps its place (keyshared
	// contract 4).
	KeySharedAwayTimeout time.Duration

	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// ProducerPaths builds the producer-path handler of each connection;
	// nil means every producer passthrough with duplicate chunks removed
	// (RebatchPaths with no policies and a default ChunkDedup).
	ProducerPaths ProducerPathFactory
}

// DefaultConfig returns the defaults documented by cmd/proxy --help.
func DefaultConfig() Config {
	return Config{
		Listen:               "127.0.0.1:6650",
		ConnectTimeout:       10 * time.Second,
		HandshakeTimeout:     30 * time.Second,
		IdleTimeout:          5 * time.Minute,
		MaxMessageSize:       wire.DefaultMaxMessageSize,
		SoftBufferLimit:      4 << 20,
		HardBufferLimit:      64 << 20,
		MemoryBudget:         256 << 20,
		MaxConcurrentLookups: 1024,
		MaxConnectionLookups: 256,
		MaxLookupRedirects:   20,
		LookupTimeout:        30 * time.Second,
		DrainTimeout:         30 * time.Second,
		ReadBufferCap:        256 << 10,
		WebTimeout:           60 * time.Second,
		HandoffTimeout:       10 * time.Second,
		KeySharedAwayTimeout: 10 * time.Second,
	}
}

// Validate reports the first invalid field, naming it by its config key.
func (c *Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen: %q: %v", c.Listen, err)
	}
	if len(c.Brokers) == 0 {
		return fmt.Errorf("broker-url: at least one broker service URL is required")
	}
	for _, b := range c.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return fmt.Errorf("broker-url: %q: %v", b, err)
		}
	}
	for _, b := range c.AllowedBrokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return fmt.Errorf("allowed-brokers: %q: %v", b, err)
		}
	}
	switch {
	case c.ConnectTimeout <= 0:
		return fmt.Errorf("connect-timeout: must be > 0")
	case c.HandshakeTimeout <= 0:
		return fmt.Errorf("handshake-timeout: must be > 0")
	case c.IdleTimeout < 0:
		return fmt.Errorf("idle-timeout: must be >= 0")
	case c.MaxMessageSize <= 0:
		return fmt.Errorf("max-message-size: must be > 0")
	case c.MemoryBudget < 0:
		return fmt.Errorf("memory-budget: must be >= 0 (0: no budget)")
	case c.SoftBufferLimit <= 0:
		return fmt.Errorf("soft-buffer-limit: must be > 0")
	case c.HardBufferLimit < c.SoftBufferLimit+wire.MaxFrameLen(c.MaxMessageSize):
		return fmt.Errorf("hard-buffer-limit: must be at least soft-buffer-limit + max-message-size + 10 KiB (%d)",
			c.SoftBufferLimit+wire.MaxFrameLen(c.MaxMessageSize))
	case c.MaxConcurrentLookups <= 0:
		return fmt.Errorf("max-concurrent-lookups: must be > 0")
	case c.MaxConnectionLookups <= 0:
		return fmt.Errorf("max-connection-lookups: must be > 0")
	case c.MaxLookupRedirects < 0:
		return fmt.Errorf("max-lookup-redirects: must be >= 0 (0 relays redirects to the client)")
	case c.LookupTimeout <= 0:
		return fmt.Errorf("lookup-timeout: must be > 0")
	case c.DrainTimeout < 0:
		return fmt.Errorf("drain-timeout: must be >= 0")
	case c.EventLoops < 0:
		return fmt.Errorf("event-loops: must be >= 0")
	case c.ReadBufferCap <= 0:
		return fmt.Errorf("read-buffer: must be > 0")
	case c.TLSListen != "" && (c.TLSCertFile == "" || c.TLSKeyFile == ""):
		return fmt.Errorf("tls-listen: needs tls-cert and tls-key")
	case c.WebTLSListen != "" && (c.TLSCertFile == "" || c.TLSKeyFile == ""):
		return fmt.Errorf("web-tls-listen: needs tls-cert and tls-key")
	case c.TLSListen == "" && c.WebTLSListen == "" && c.BrokerPortsTLSListen == "" && (c.TLSCertFile != "" || c.TLSClientCAFile != ""):
		return fmt.Errorf("tls-cert / tls-client-ca: given without tls-listen, web-tls-listen or broker-ports-tls-listen")
	case (c.WebListen != "" || c.WebTLSListen != "") && len(c.BrokerWebURLs) == 0:
		return fmt.Errorf("web-listen / web-tls-listen: needs broker-web-url")
	case len(c.FunctionWorkerWebURLs) > 0 && c.WebListen == "" && c.WebTLSListen == "":
		return fmt.Errorf("function-worker-web-url: given without web-listen or web-tls-listen")
	case c.WebTimeout <= 0:
		return fmt.Errorf("web-timeout: must be > 0")
	case c.HandoffTimeout <= 0:
		return fmt.Errorf("key-shared-handoff-timeout: must be > 0")
	case c.KeySharedAwayTimeout <= 0:
		return fmt.Errorf("key-shared-away-timeout: must be > 0")
	case !c.BrokerTLS && !c.httpsBrokerWeb() && (c.BrokerTLSTrustCertsFile != "" || c.BrokerTLSCertFile != ""):
		return fmt.Errorf("broker-tls-trust-certs / broker-tls-cert: given without pulsar+ssl:// broker URLs or https:// broker or functions worker web URLs")
	case (c.BrokerTLSCertFile == "") != (c.BrokerTLSKeyFile == ""):
		return fmt.Errorf("broker-tls-cert and broker-tls-key go together")
	}
	if err := c.validateBrokerPorts(); err != nil {
		return err
	}
	if c.BrokerClientAuth != nil {
		if err := c.BrokerClientAuth.validate(c); err != nil {
			return err
		}
	}
	if c.TLSListen != "" {
		if _, _, err := net.SplitHostPort(c.TLSListen); err != nil {
			return fmt.Errorf("tls-listen: %q: %v", c.TLSListen, err)
		}
	}
	return nil
}

// httpsBrokerWeb reports whether some broker or functions worker web URL is
// https:// (the broker TLS settings apply to it).
func (c *Config) httpsBrokerWeb() bool {
	https := func(u string) bool { return strings.HasPrefix(u, "https://") }
	return slices.ContainsFunc(c.BrokerWebURLs, https) || slices.ContainsFunc(c.FunctionWorkerWebURLs, https)
}

// BrokerAddress turns a Pulsar service URL ("pulsar://host:port", "pulsar+ssl://host:port", or
// a bare host:port) into host:port; the port defaults to 6650 (6651 for pulsar+ssl://). The
// scheme says nothing else to the proxy: whether brokers are dialled with TLS is
// Config.BrokerTLS, and a client names a broker in proxy_to_broker_url by either spelling
// (setTLSURL).
func BrokerAddress(serviceURL string) (string, error) {
	s := strings.TrimSpace(serviceURL)
	if !strings.Contains(s, "://") {
		s = "pulsar://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", err
	}
	defaultPort := "6650"
	switch u.Scheme {
	case "pulsar":
	case "pulsar+ssl":
		defaultPort = "6651"
	default:
		return "", fmt.Errorf("scheme %q not supported (pulsar:// or pulsar+ssl://)", u.Scheme)
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return "", fmt.Errorf("%q has no host", serviceURL)
	}
	if port == "" {
		port = defaultPort
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("%q: bad port", serviceURL)
	}
	return net.JoinHostPort(host, port), nil
}
