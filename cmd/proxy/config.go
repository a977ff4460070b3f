package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rebatchproxy/rebatchproxy/proxy"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
	"github.com/rebatchproxy/rebatchproxy/route"
)

// options are the command's settings. Every option is a flag; the YAML file
// uses the same names as keys, so one table documents both.
type options struct {
	config         string
	listen         string
	brokerURLs     listValue
	allowedBrokers listValue
	brokerWebURLs  listValue
	workerWebURLs  listValue
	webListen      string
	webTLSListen   string
	brokerPorts    string
	brokerPortsTLS string
	advertisedHost string
	webTimeout     time.Duration
	// chunkLookEntries bounds the entries read back per look at a topic for a resuming
	// chunking producer (0: no look); chunkLookToken is the admin API token file for it.
	chunkLookEntries int
	chunkLookToken   string
	handoffTimeout   time.Duration
	ksAwayTimeout    time.Duration
	brokerTrust      string
	brokerCert       string
	brokerKey        string
	brokerNoVerify   bool
	brokerAuth       string
	connectTimeout   time.Duration
	handshake        time.Duration
	idle             time.Duration
	drain            time.Duration
	maxMessageSize   byteSize
	softLimit        byteSize
	hardLimit        byteSize
	memoryBudget     byteSize
	maxLookups       int
	maxConnLookups   int
	maxRedirects     int
	lookupTimeout    time.Duration
	eventLoops       int
	readBuffer       byteSize
	tlsListen        string
	tlsCert          string
	tlsKey           string
	tlsClientCA      string
	metricsListen    string
	logLevel         string
	logFormat        string
	pprof            bool
	// policies is the per-topic policy table from the config file (nil: all
	// passthrough).
	policies *route.Matcher[rebatch.Policy]
}

// newFlagSet declares every option with its default and help text.
func newFlagSet(o *options) *flag.FlagSet {
	d := proxy.DefaultConfig()
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	fs.StringVar(&o.config, "config", "", "YAML config `file`; its keys are the flag names below. Flags given on the command line override it.")
	fs.StringVar(&o.listen, "listen", d.Listen, "client-facing `host:port`")
	fs.Var(&o.brokerURLs, "broker-url", "service URL of the Pulsar cluster, pulsar://host:port (required; repeat or comma-separate for several; lookup connections go to them round robin)")
	fs.Var(&o.allowedBrokers, "allowed-brokers", "extra broker `host:port` targets a client may name in proxy_to_broker_url, besides the service URLs and brokers learned from lookups (repeat or comma-separate)")
	fs.DurationVar(&o.connectTimeout, "connect-timeout", d.ConnectTimeout, "TCP connect timeout to a broker")
	fs.DurationVar(&o.handshake, "handshake-timeout", d.HandshakeTimeout, "time allowed from accepting a client until the broker's CONNECTED is relayed")
	fs.DurationVar(&o.idle, "idle-timeout", d.IdleTimeout, "close a connection pair after this long with no traffic either way (0 disables; clients ping every 30s)")
	fs.DurationVar(&o.drain, "drain-timeout", d.DrainTimeout, "on SIGTERM/SIGINT, how long open connections may drain before they are closed")
	o.maxMessageSize = byteSize(d.MaxMessageSize)
	fs.Var(&o.maxMessageSize, "max-message-size", "frame limit until the broker's CONNECTED gives its own (frames may be this + 10KiB); sizes accept KiB/MiB/GiB suffixes")
	o.softLimit = byteSize(d.SoftBufferLimit)
	fs.Var(&o.softLimit, "soft-buffer-limit", "bytes queued towards a slow side after which the proxy stops reading frames from the other side")
	o.hardLimit = byteSize(d.HardBufferLimit)
	fs.Var(&o.hardLimit, "hard-buffer-limit", "bytes held for one direction after which the connection pair is closed with a logged reason (>= soft + max message size + 10KiB)")
	o.memoryBudget = byteSize(d.MemoryBudget)
	fs.Var(&o.memoryBudget, "memory-budget", "the proxy's memory target: half of it bounds the bytes all connections together hold (unread input, output queued towards slow sides; above that every direction pauses at 256KiB queued, slowing the slow sides harder), the rest is headroom for garbage collection; also Go's memory limit unless GOMEMLIMIT is set; a quarter of it bounds what the web port's requests in flight hold, their bodies and 64KiB each (0 = no budget)")
	fs.IntVar(&o.maxLookups, "max-concurrent-lookups", d.MaxConcurrentLookups, "LOOKUP and PARTITIONED_METADATA requests in flight at once; excess ones get TooManyRequests")
	fs.IntVar(&o.maxConnLookups, "max-connection-lookups", d.MaxConnectionLookups, "LOOKUP and PARTITIONED_METADATA requests in flight at once from one client connection (within max-concurrent-lookups); its excess ones get TooManyRequests, so one client's flood is not refused to others")
	fs.IntVar(&o.maxRedirects, "max-lookup-redirects", d.MaxLookupRedirects, "lookup redirects the proxy follows itself, asking each named broker as the client, before answering the client ServiceNotReady; 0 relays redirects to the client instead (the default is the Java client's maxLookupRedirects)")
	fs.DurationVar(&o.lookupTimeout, "lookup-timeout", d.LookupTimeout, "time allowed for following one lookup's redirects, all hops included")
	fs.IntVar(&o.eventLoops, "event-loops", d.EventLoops, "gnet event loops (0 = one per P: GOMAXPROCS, from the CPUs and the CPU quota; with one, GOMAXPROCS is raised to 2 unless set)")
	fs.StringVar(&o.webListen, "web-listen", "", "`host:port` of the web port (HTTP): the brokers' admin REST API (/admin/...) and HTTP lookups (/lookup/...) forwarded to --broker-web-url, broker redirects followed by the proxy")
	fs.StringVar(&o.webTLSListen, "web-tls-listen", "", "`host:port` of the web port over HTTPS (with --tls-cert, --tls-key, --tls-client-ca)")
	fs.Var(&o.brokerWebURLs, "broker-web-url", "web service URL of the brokers, http://host:8080 or https://host:8443 (required with a web port; repeat or comma-separate; requests go to them round robin; https:// uses the broker-tls-* settings)")
	fs.Var(&o.workerWebURLs, "function-worker-web-url", "web service URL of functions workers that run apart from the brokers, http://host:6750 or https://host:6751 (repeat or comma-separate): the admin paths of Pulsar Functions, sources, sinks and workers (/admin[/v2|/v3]/functions|function|sources|source|sinks|sink|worker|worker-stats/...) go to them round robin instead of to --broker-web-url, as Pulsar's proxy does with functionWorkerWebServiceURL; empty: the brokers serve them (their own functions worker)")
	fs.DurationVar(&o.webTimeout, "web-timeout", d.WebTimeout, "time allowed for one web request, broker redirects included")
	fs.StringVar(&o.brokerPorts, "broker-ports-listen", "", "`host:port` from which the proxy listens on one port per --broker-url (port, port+1, ...; 0: any free ports), for clients whose service URL is the web port (http://): HTTP lookup answers then name the broker's port on the proxy, and a client connecting there is sent to that broker (needs --web-listen or --web-tls-listen)")
	fs.StringVar(&o.brokerPortsTLS, "broker-ports-tls-listen", "", "`host:port`: the same over TLS (with --tls-cert, --tls-key, --tls-client-ca), named in HTTP lookup answers' brokerUrlTls, for https:// service URLs")
	fs.StringVar(&o.advertisedHost, "advertised-host", "", "`host` that HTTP lookup answers name for the ports per broker (default: the host of --broker-ports-listen, which must then not be 0.0.0.0)")
	fs.IntVar(&o.chunkLookEntries, "chunk-recovery-entries", 1000, "duplicate-chunk removal across proxy instances and restarts: when a producer that reconnected sends chunks, read up to this many of the topic's newest entries through --broker-web-url (admin API examinemessage) to learn which chunks are already stored before forwarding (0: do not look; without --broker-web-url there is no look)")
	fs.StringVar(&o.chunkLookToken, "chunk-recovery-token-file", "", "`file` holding the token (JWT) the proxy sends to the admin API for those reads, for a role allowed to peek at the topics' messages (empty: none)")
	fs.DurationVar(&o.handoffTimeout, "key-shared-handoff-timeout", d.HandoffTimeout, "managed Key_Shared subscriptions (buckets policy, manage_key_shared): how long a consumer giving up buckets in a rebalance may take to acknowledge what it was sent before the proxy closes it anyway (the broker then redelivers the rest to the buckets' next owner)")
	fs.DurationVar(&o.ksAwayTimeout, "key-shared-away-timeout", d.KeySharedAwayTimeout, "managed Key_Shared subscriptions: how long a consumer released in a rebalance keeps its place while its client resubscribes, before the subscription is rebalanced without it")
	fs.StringVar(&o.brokerTrust, "broker-tls-trust-certs", "", "PEM CA certificates `file` trusted for pulsar+ssl:// brokers and https:// broker web URLs (empty: the system's)")
	fs.StringVar(&o.brokerCert, "broker-tls-cert", "", "PEM client certificate `file` the proxy presents to pulsar+ssl:// brokers (optional)")
	fs.StringVar(&o.brokerKey, "broker-tls-key", "", "PEM private key `file` of --broker-tls-cert")
	fs.BoolVar(&o.brokerNoVerify, "broker-tls-no-hostname-verification", false, "do not check that a pulsar+ssl:// broker's certificate names its host (the chain is still verified)")
	fs.StringVar(&o.brokerAuth, "broker-client-auth", "", "the proxy's own credential for clients that authenticate with a TLS certificate: `tls` (its --broker-tls-cert) or token:FILE; the proxy verifies the client's certificate (--tls-client-ca) and connects as a proxy role naming the client's common name as original_principal (brokers need it in proxyRoles); on the HTTPS web port likewise, with X-Original-Principal; empty: such clients are passed through, or refused when the proxy has a --broker-tls-cert")
	fs.StringVar(&o.tlsListen, "tls-listen", "", "`host:port` of a TLS listener for pulsar+ssl:// clients, beside --listen (brokers are dialled as --broker-url says: pulsar:// or pulsar+ssl://); needs --tls-cert and --tls-key")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "PEM certificate chain `file` of the TLS listener (re-read on SIGHUP)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "PEM private key `file` of the TLS listener (re-read on SIGHUP)")
	fs.StringVar(&o.tlsClientCA, "tls-client-ca", "", "PEM CA certificates `file`: when set, TLS clients must present a certificate one of them signed")
	o.readBuffer = byteSize(d.ReadBufferCap)
	fs.Var(&o.readBuffer, "read-buffer", "gnet read buffer per event loop")
	fs.StringVar(&o.metricsListen, "metrics-listen", "127.0.0.1:9650", "`host:port` serving /metrics, /healthz, /readyz (and /debug/pprof/ with --pprof); empty disables")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "text or json")
	fs.BoolVar(&o.pprof, "pprof", false, "serve net/http/pprof under /debug/pprof/ on --metrics-listen")
	return fs
}

// usageTail is printed after the flag list by --help.
const usageTail = `
Config file (--config): a YAML mapping whose keys are the flag names above,
for example:

  listen: 0.0.0.0:6650
  broker-url: [pulsar://broker-1:6650, pulsar://broker-2:6650]
  allowed-brokers: [broker-3:6650]
  idle-timeout: 10m
  hard-buffer-limit: 128MiB
  metrics-listen: 0.0.0.0:9650
  policies: []   # per-topic rebatching policies, see below

An unknown key or a bad value stops the proxy at start with a message naming
the key. Flags given on the command line override the file.
`

// parseArgs parses the command line and then the config file it names.
func parseArgs(args []string) (*options, error) {
	o := &options{}
	fs := newFlagSet(o)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: proxy [flags]\n\nA transparent Pulsar-protocol proxy.\n\nFlags:\n")
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), usageTail)
		fmt.Fprint(fs.Output(), policiesHelp())
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.config != "" {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		data, err := os.ReadFile(o.config)
		if err != nil {
			return nil, err
		}
		if err := applyFile(fs, set, data, o); err != nil {
			return nil, fmt.Errorf("config %s: %w", o.config, err)
		}
	}
	return o, nil
}

// applyFile sets every key of a YAML config through its flag, skipping keys
// whose flag was given on the command line.
func applyFile(fs *flag.FlagSet, cmdline map[string]bool, data []byte, o *options) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return err
	}
	if len(doc.Content) == 0 {
		return nil // empty file
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return errors.New("top level must be a mapping of option names to values")
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		key := k.Value
		if seen[key] {
			return fmt.Errorf("line %d: key %q given twice", k.Line, key)
		}
		seen[key] = true
		if key == "policies" {
			m, err := parsePolicies(v)
			if err != nil {
				return fmt.Errorf("line %d: key %q: %w", k.Line, key, err)
			}
			o.policies = m
			continue
		}
		if key == "config" || fs.Lookup(key) == nil {
			return fmt.Errorf("line %d: unknown key %q (known: %s)", k.Line, key, strings.Join(knownKeys(fs), ", "))
		}
		if cmdline[key] {
			continue
		}
		var vals []string
		switch v.Kind {
		case yaml.ScalarNode:
			vals = []string{v.Value}
		case yaml.SequenceNode:
			if _, ok := fs.Lookup(key).Value.(*listValue); !ok {
				return fmt.Errorf("line %d: key %q takes one value, not a list", k.Line, key)
			}
			for _, item := range v.Content {
				if item.Kind != yaml.ScalarNode {
					return fmt.Errorf("line %d: key %q: list items must be strings", item.Line, key)
				}
				vals = append(vals, item.Value)
			}
		default:
			return fmt.Errorf("line %d: key %q: expected a value or a list", k.Line, key)
		}
		for _, s := range vals {
			if err := fs.Set(key, s); err != nil {
				return fmt.Errorf("line %d: key %q: %v", v.Line, key, err)
			}
		}
	}
	return nil
}

func knownKeys(fs *flag.FlagSet) []string {
	var ks []string
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "config" {
			ks = append(ks, f.Name)
		}
	})
	ks = append(ks, "policies")
	sort.Strings(ks)
	return ks
}

// listValue is a repeatable, comma-separated string flag.
type listValue []string

func (l *listValue) String() string { return strings.Join(*l, ",") }

// Set implements flag.Value.
func (l *listValue) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// byteSize is a size flag accepting B, KiB, MiB, GiB (and KB, MB, GB as
// powers of ten) suffixes.
type byteSize int

func (b *byteSize) String() string { return strconv.Itoa(int(*b)) }

// Set implements flag.Value.
func (b *byteSize) Set(s string) error {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<40)/mult {
		return fmt.Errorf("not a size: %q (use e.g. 65536, 512KiB, 4MiB)", s)
	}
	*b = byteSize(n * mult)
	return nil
}

// proxyConfig turns the options into a proxy.Config (not yet validated).
func (o *options) proxyConfig() (proxy.Config, error) {
	c := proxy.DefaultConfig()
	c.Listen = o.listen
	tlsURLs := 0
	for _, u := range o.brokerURLs {
		if strings.HasPrefix(strings.TrimSpace(u), "pulsar+ssl://") {
			tlsURLs++
		}
		a, err := proxy.BrokerAddress(u)
		if err != nil {
			return c, fmt.Errorf("broker-url: %q: %v", u, err)
		}
		c.Brokers = append(c.Brokers, a)
	}
	if tlsURLs > 0 && tlsURLs < len(o.brokerURLs) {
		return c, fmt.Errorf("broker-url: all pulsar+ssl:// or all pulsar://, not both: the proxy speaks TLS to every broker or to none")
	}
	c.BrokerTLS = tlsURLs > 0
	c.BrokerTLSTrustCertsFile, c.BrokerTLSCertFile, c.BrokerTLSKeyFile = o.brokerTrust, o.brokerCert, o.brokerKey
	c.BrokerTLSNoHostnameVerification = o.brokerNoVerify
	switch method, file, _ := strings.Cut(o.brokerAuth, ":"); {
	case o.brokerAuth == "":
	case method == "token" && file != "":
		c.BrokerClientAuth = &proxy.BrokerClientAuth{Method: "token", TokenFile: file}
	default:
		c.BrokerClientAuth = &proxy.BrokerClientAuth{Method: o.brokerAuth}
	}
	c.AllowedBrokers = append(c.AllowedBrokers, o.allowedBrokers...)
	c.ConnectTimeout, c.HandshakeTimeout, c.IdleTimeout, c.DrainTimeout = o.connectTimeout, o.handshake, o.idle, o.drain
	c.MaxMessageSize, c.SoftBufferLimit, c.HardBufferLimit = int(o.maxMessageSize), int(o.softLimit), int(o.hardLimit)
	c.MemoryBudget = int(o.memoryBudget)
	c.MaxConcurrentLookups, c.EventLoops, c.ReadBufferCap = o.maxLookups, o.eventLoops, int(o.readBuffer)
	c.TLSListen, c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile = o.tlsListen, o.tlsCert, o.tlsKey, o.tlsClientCA
	c.WebListen, c.WebTLSListen, c.BrokerWebURLs, c.WebTimeout = o.webListen, o.webTLSListen, o.brokerWebURLs, o.webTimeout
	c.FunctionWorkerWebURLs = o.workerWebURLs
	c.BrokerPortsListen, c.BrokerPortsTLSListen, c.AdvertisedHost = o.brokerPorts, o.brokerPortsTLS, o.advertisedHost
	c.HandoffTimeout, c.KeySharedAwayTimeout = o.handoffTimeout, o.ksAwayTimeout
	c.MaxLookupRedirects, c.LookupTimeout, c.MaxConnectionLookups = o.maxRedirects, o.lookupTimeout, o.maxConnLookups
	return c, c.Validate()
}

// storedReader is the reader of the look at a topic for resuming chunking producers, or nil
// when there is none (no --broker-web-url, or chunk-recovery-entries 0).
func (o *options) storedReader(c proxy.Config) (*proxy.AdminStoredReader, error) {
	if len(o.brokerWebURLs) == 0 || o.chunkLookEntries <= 0 {
		if o.chunkLookToken != "" {
			return nil, errors.New("chunk-recovery-token-file: needs broker-web-url and chunk-recovery-entries > 0")
		}
		return nil, nil
	}
	r := &proxy.AdminStoredReader{WebURLs: o.brokerWebURLs, MaxEntries: o.chunkLookEntries,
		MaxPayload: int64(c.MaxMessageSize) + 64<<10}
	if o.chunkLookToken != "" {
		b, err := os.ReadFile(o.chunkLookToken)
		if err != nil {
			return nil, fmt.Errorf("chunk-recovery-token-file: %w", err)
		}
		if r.Token = strings.TrimSpace(string(b)); r.Token == "" {
			return nil, fmt.Errorf("chunk-recovery-token-file: %s is empty", o.chunkLookToken)
		}
	}
	if o.brokerTrust != "" || o.brokerCert != "" {
		tc, err := proxy.BrokerTLSConfig(&c)
		if err != nil {
			return nil, err
		}
		r.TLS = tc
	}
	return r, nil
}
