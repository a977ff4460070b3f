// Package drivers runs real, released Pulsar clients as test drivers: pulsar-client-go at several
// tags, the Java client from Maven Central and the Python client from PyPI. Each driver is a small
// program with the same command line and the same JSON-lines output (README.md beside this file),
// so that tests and the compatibility matrix are client-agnostic: they call Produce and Consume on
// a Driver and read typed results.
//
// Drivers are built or installed lazily into a git-ignored cache (.cache/ beside this file, or
// $DRIVERS_CACHE_DIR), keyed by a hash of their sources, so a second run builds and downloads
// nothing. A missing tool or an unreachable registry is an error naming it, never a skip.
package drivers

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Exit codes shared by every driver program.
const (
	ExitOK          = 0
	ExitFailed      = 1 // ran, but some sends failed or too few messages were acknowledged
	ExitUsage       = 2 // bad command line
	ExitUnsupported = 3 // this client version cannot do what was asked
)

// Feature names a capability that some pinned client versions lack. The names match the
// "feature" field of the drivers' unsupported lines.
type Feature string

// Features that not every driver has.
const (
	FeatureChunking      Feature = "chunking"             // produce --chunking
	FeatureChunkSize     Feature = "chunk-size"           // produce --chunking --chunk-size B
	FeatureSnappy        Feature = "compression=snappy"   // produce --compression snappy
	FeatureStickyRanges  Feature = "key_shared_sticky"    // consume --type key_shared --sticky-ranges
	FeatureOrderingKey   Feature = "ordering-key"         // produce --ordering-key
	FeatureObserveOrdKey Feature = "observe-ordering-key" // consumer reports ordering_key
	FeatureObserveSeq    Feature = "observe-seq"          // consumer reports each message's sequence id
	FeatureSchema        Feature = "schema"               // produce/consume --schema json|avro
	FeatureNack          Feature = "nack-first"           // consume --nack-first K
	FeatureTLSAuth       Feature = "tls-cert"             // --tls-cert-file/--tls-key-file: TLS client-certificate authentication
	FeatureHTTPLookup    Feature = "http-lookup"          // an http:// or https:// service URL
)

// Quirk is a known misbehaviour of a released client. Drivers do not hide quirks; tests that meet
// one assert it, so that a fix (or a new occurrence) is noticed.
type Quirk string

// Known quirks.
const (
	// QuirkDropsUnbatchedOrderingKey: with batching off, the client sends no ordering key
	// (pulsar-client-go v0.10.0; v0.8.1 sends unbatched messages as batches of one and keeps it).
	QuirkDropsUnbatchedOrderingKey Quirk = "drops-unbatched-ordering-key"
)

var quirks = map[string][]Quirk{
	"go-v0.10.0": {QuirkDropsUnbatchedOrderingKey},
}

// HasQuirk says whether the driver's client is known to show q.
func (d *Driver) HasQuirk(q Quirk) bool {
	for _, x := range quirks[d.Name] {
		if x == q {
			return true
		}
	}
	return false
}

// Driver is one pinned client version.
type Driver struct {
	Name    string // e.g. "go-v0.8.1", "java-4.0.13", "python-3.13.0"
	Client  string // "go", "java" or "python"
	Version string // the client's own version string, e.g. "v0.8.1", "4.0.13", "3.13.0"

	unsupported map[Feature]string // feature -> why not
	pythonReqs  []string           // pip requirements (python drivers)
	goDir       string             // module directory (go drivers)

	mu   sync.Mutex
	argv []string // command prefix once prepared
}

// Supports says whether the driver can do f; the drivers themselves report unsupported requests
// with exit code 3, and the package tests check that this table agrees with them.
func (d *Driver) Supports(f Feature) bool {
	_, no := d.unsupported[f]
	return !no
}

// Unsupported lists the features this driver lacks, with the reason.
func (d *Driver) Unsupported() map[Feature]string {
	out := make(map[Feature]string, len(d.unsupported))
	for k, v := range d.unsupported {
		out[k] = v
	}
	return out
}

// Java client versions from Maven Central (org.apache.pulsar:pulsar-client), with what each lacks
// (checked against its jars). 3.0.x is 3.0.7: the newest 3.0.x whose pulsar-client-api (and parent
// POM) Maven Central serves here; 3.0.8..3.0.17 publish pulsar-client but not pulsar-client-api, so
// they cannot be assembled as released.
var javaVersions = []struct {
	version string
	lacks   map[Feature]string
}{
	{"2.10.6", map[Feature]string{FeatureChunkSize: "ProducerBuilder.chunkMaxMessageSize is missing in 2.10.6"}},
	{"3.0.7", nil},
	{"4.0.13", nil},
}

// Python client versions from PyPI with their pip requirements and what each lacks (checked
// against the installed packages). 3.1.0 is the oldest with CPython 3.11 wheels; its [avro] extra
// pins fastavro 0.24.0, which has no 3.11 wheel and does not build, so both versions get the same
// fastavro explicitly.
var pythonVersions = []struct {
	version string
	reqs    []string
	lacks   map[Feature]string
}{
	{"3.1.0", []string{"pulsar-client==3.1.0", "fastavro==1.13.1"}, map[Feature]string{
		FeatureStickyRanges:  "subscribe has no key_shared_policy in 3.1.0",
		FeatureOrderingKey:   "Producer.send has no ordering_key in 3.1.0",
		FeatureObserveOrdKey: "Message has no ordering_key() in 3.1.0",
	}},
	{"3.13.0", []string{"pulsar-client==3.13.0", "fastavro==1.13.1"}, nil},
}

var (
	registryOnce sync.Once
	registry     []*Driver
	registryErr  error
)

// All returns every driver: the Go versions found under go/v*/, then Java, then Python, then Rust.
func All() ([]*Driver, error) {
	registryOnce.Do(func() { registry, registryErr = discover() })
	return registry, registryErr
}

// rustDriver is pulsar-rs (rust/, 6.9.1 pinned by its Cargo.lock): a client written from the
// protocol rather than on the C++ library, built with cargo. It implements the shared command
// line but for the features listed here, which it answers as unsupported.
func rustDriver() *Driver {
	return &Driver{Name: "rust-6.9.1", Client: "rust", Version: "6.9.1", unsupported: map[Feature]string{
		FeatureChunking:     "pulsar-rs has no producer chunking",
		FeatureChunkSize:    "pulsar-rs has no producer chunking",
		FeatureOrderingKey:  "the pulsar-rs driver sets no ordering key",
		FeatureStickyRanges: "the pulsar-rs driver sets no Key_Shared sticky ranges",
		FeatureObserveSeq:   "the pulsar-rs driver does not report sequence ids",
		FeatureSchema:       "the pulsar-rs driver sends and reads bytes only",
		FeatureNack:         "the pulsar-rs driver does not negative-acknowledge",
		FeatureTLSAuth:      "pulsar-rs has no TLS client-certificate authentication",
		FeatureHTTPLookup:   "pulsar-rs takes pulsar:// and pulsar+ssl:// service URLs only",
	}}
}

// ByName returns the driver called name, e.g. "go-v0.8.1", "java-4.0.13" or "rust-6.9.1".
func ByName(name string) (*Driver, error) {
	all, err := All()
	if err != nil {
		return nil, err
	}
	for _, d := range all {
		if d.Name == name {
			return d, nil
		}
	}
	names := make([]string, len(all))
	for i, d := range all {
		names[i] = d.Name
	}
	return nil, fmt.Errorf("drivers: no driver %q (have %s)", name, strings.Join(names, ", "))
}

func discover() ([]*Driver, error) {
	root, err := SourceDir()
	if err != nil {
		return nil, err
	}
	var out []*Driver
	mods, _ := filepath.Glob(filepath.Join(root, "go", "v*", "go.mod"))
	sort.Slice(mods, func(i, j int) bool {
		return semverLess(filepath.Base(filepath.Dir(mods[i])), filepath.Base(filepath.Dir(mods[j])))
	})
	for _, m := range mods {
		dir := filepath.Dir(m)
		v := filepath.Base(dir)
		d := &Driver{Name: "go-" + v, Client: "go", Version: v, goDir: dir, unsupported: map[Feature]string{
			FeatureObserveSeq: "pulsar-client-go's Message has no sequence id",
		}}
		// gen.sh links chunking.go to chunking_no.go for versions without producer chunking.
		if target, err := os.Readlink(filepath.Join(dir, "chunking.go")); err != nil {
			return nil, fmt.Errorf("drivers: %s: chunking.go is not a link into ../common (rerun go/gen.sh): %v", d.Name, err)
		} else if strings.Contains(target, "chunking_no") {
			d.unsupported[FeatureChunking] = "pulsar-client-go before v0.10.0 has no producer chunking"
			d.unsupported[FeatureChunkSize] = d.unsupported[FeatureChunking]
		}
		// ... and snappy.go to snappy_no.go for versions without the snappy codec.
		if target, err := os.Readlink(filepath.Join(dir, "snappy.go")); err != nil {
			return nil, fmt.Errorf("drivers: %s: snappy.go is not a link into ../common (rerun go/gen.sh): %v", d.Name, err)
		} else if strings.Contains(target, "snappy_no") {
			d.unsupported[FeatureSnappy] = "pulsar-client-go before v0.17.0 has no snappy codec"
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("drivers: no Go driver modules under %s/go/v*/", root)
	}
	for _, j := range javaVersions {
		d := &Driver{Name: "java-" + j.version, Client: "java", Version: j.version, unsupported: map[Feature]string{}}
		for f, why := range j.lacks {
			d.unsupported[f] = why
		}
		out = append(out, d)
	}
	for _, p := range pythonVersions {
		d := &Driver{Name: "python-" + p.version, Client: "python", Version: p.version, pythonReqs: p.reqs,
			unsupported: map[Feature]string{
				FeatureChunkSize:  "the Python client has no chunk size setting",
				FeatureObserveSeq: "the Python client's Message has no sequence id",
			}}
		for f, why := range p.lacks {
			d.unsupported[f] = why
		}
		out = append(out, d)
	}
	return append(out, rustDriver()), nil
}

// semverLess compares dotted versions with an optional leading "v", numerically.
func semverLess(a, b string) bool {
	pa := strings.Split(strings.TrimPrefix(a, "v"), ".")
	pb := strings.Split(strings.TrimPrefix(b, "v"), ".")
	for i := 0; i < len(pa) || i < len(pb); i++ {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

// SourceDir is the directory holding this package's sources and the driver sources
// ($DRIVERS_DIR overrides it).
func SourceDir() (string, error) {
	if d := os.Getenv("DRIVERS_DIR"); d != "" {
		return d, nil
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		dir := filepath.Dir(file)
		if _, err := os.Stat(filepath.Join(dir, "java", "PulsarDriver.java")); err == nil {
			return dir, nil
		}
	}
	// Built with -trimpath: look upwards from the working directory.
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		cand := filepath.Join(dir, "e2e", "drivers")
		if _, err := os.Stat(filepath.Join(cand, "java", "PulsarDriver.java")); err == nil {
			return cand, nil
		}
		if filepath.Dir(dir) == dir {
			return "", errors.New("drivers: cannot find the e2e/drivers sources; set DRIVERS_DIR")
		}
	}
}

// CacheDir is where drivers are built and installed ($DRIVERS_CACHE_DIR, else .cache/ in SourceDir).
func CacheDir() (string, error) {
	if d := os.Getenv("DRIVERS_CACHE_DIR"); d != "" {
		return d, nil
	}
	src, err := SourceDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(src, ".cache"), nil
}

// ---------------------------------------------------------------------------------------------
// specs

// ProduceSpec describes one produce run. Zero values mean the client's defaults, except where noted.
type ProduceSpec struct {
	URL              string
	Topic            string
	Count            int
	Batching         *bool  // nil: client default (on), or off when Chunking is set
	BatchMaxMessages int    // 0: client default
	BatchMaxBytes    int    // 0: client default
	BatchDelay       *int   // milliseconds; nil: client default
	Batcher          string // "", "default" or "key-based"
	KeyMode          string // "", "none", "fixed", "random" or "seq"
	Keys             int    // distinct keys for random|seq (key-0..key-<K-1>); 0: 10
	OrderingKey      bool   // also set the key as ordering key
	EmptyKey         bool   // Java drivers only: key index 0 is the empty key "" (.key("")) instead of key-0
	Properties       string // "k=v,..."; "{i}" and "{i%N}" in values are expanded per message
	Compression      string // "", "none", "lz4", "zlib", "zstd", "snappy"
	Chunking         bool
	ChunkSize        int    // bytes; 0: the broker's max message size
	Size             int    // pad payloads to this many bytes
	Schema           string // "", "bytes", "json" or "avro"
	Sync             bool
	ProducerName     string
	Token            string
	TLSTrustCerts    string // CA file for a pulsar+ssl:// URL (hostname verified)
	TLSCertFile      string // with TLSKeyFile: authenticate by TLS client certificate
	TLSKeyFile       string
	SendTimeout      *int  // milliseconds; nil: client default; 0: none
	SeqStart         int64 // >= 0 with ExplicitSeq: message i gets sequence id SeqStart+i
	ExplicitSeq      bool
	SeqScramble      bool          // Java only: message i gets SeqStart + (i*7919 mod Count), ids out of order
	Txn              string        // Java only: "commit" or "abort": messages Count/3..2*Count/3-1 in one transaction, ended so once every send completed (needs SendTimeout 0)
	Timeout          time.Duration // whole run inside the driver; 0: 2 minutes
}

// Bool and Int make the pointer fields easy to fill.
func Bool(b bool) *bool { return &b }

// Int returns &i.
func Int(i int) *int { return &i }

// Args renders the spec as driver flags.
func (s ProduceSpec) Args() []string {
	a := []string{"produce", "--url", s.URL, "--topic", s.Topic, "--count", strconv.Itoa(s.Count)}
	if s.Batching != nil {
		a = append(a, "--batching="+strconv.FormatBool(*s.Batching))
	}
	if s.BatchMaxMessages > 0 {
		a = append(a, "--batch-max-messages", strconv.Itoa(s.BatchMaxMessages))
	}
	if s.BatchMaxBytes > 0 {
		a = append(a, "--batch-max-bytes", strconv.Itoa(s.BatchMaxBytes))
	}
	if s.BatchDelay != nil {
		a = append(a, "--batch-delay-ms", strconv.Itoa(*s.BatchDelay))
	}
	if s.Batcher != "" {
		a = append(a, "--batcher", s.Batcher)
	}
	if s.KeyMode != "" {
		a = append(a, "--key-mode", s.KeyMode)
	}
	if s.Keys > 0 {
		a = append(a, "--keys", strconv.Itoa(s.Keys))
	}
	if s.EmptyKey {
		a = append(a, "--empty-key=true")
	}
	if s.OrderingKey {
		a = append(a, "--ordering-key=true")
	}
	if s.Properties != "" {
		a = append(a, "--properties", s.Properties)
	}
	if s.Compression != "" {
		a = append(a, "--compression", s.Compression)
	}
	if s.Chunking {
		a = append(a, "--chunking=true")
	}
	if s.ChunkSize > 0 {
		a = append(a, "--chunk-size", strconv.Itoa(s.ChunkSize))
	}
	if s.Size > 0 {
		a = append(a, "--size", strconv.Itoa(s.Size))
	}
	if s.Schema != "" {
		a = append(a, "--schema", s.Schema)
	}
	if s.Sync {
		a = append(a, "--sync=true")
	}
	if s.ProducerName != "" {
		a = append(a, "--producer-name", s.ProducerName)
	}
	if s.Token != "" {
		a = append(a, "--token", s.Token)
	}
	if s.TLSTrustCerts != "" {
		a = append(a, "--tls-trust-certs", s.TLSTrustCerts)
	}
	if s.TLSCertFile != "" {
		a = append(a, "--tls-cert-file", s.TLSCertFile, "--tls-key-file", s.TLSKeyFile)
	}
	if s.SendTimeout != nil {
		a = append(a, "--send-timeout-ms", strconv.Itoa(*s.SendTimeout))
	}
	if s.ExplicitSeq {
		a = append(a, "--seq-start", strconv.FormatInt(s.SeqStart, 10))
	}
	if s.SeqScramble {
		a = append(a, "--seq-scramble")
	}
	if s.Txn != "" {
		a = append(a, "--txn", s.Txn)
	}
	a = append(a, "--timeout-ms", strconv.FormatInt(orDefault(s.Timeout, 2*time.Minute).Milliseconds(), 10))
	return a
}

// ConsumeSpec describes one consume run.
type ConsumeSpec struct {
	URL             string
	Topic           string
	Subscription    string
	Type            string // "", "exclusive", "shared", "failover" or "key_shared"
	StickyRanges    string // "a-b,c-d" (inclusive, 0..65535); Key_Shared STICKY
	Count           int    // stop after acknowledging this many; 0: stop after Idle without messages
	Idle            time.Duration
	NackFirst       int // negative-ack the first K messages received (they are redelivered)
	NackDelay       time.Duration
	Schema          string
	Token           string
	TLSTrustCerts   string // CA file for a pulsar+ssl:// URL (hostname verified)
	TLSCertFile     string // with TLSKeyFile: authenticate by TLS client certificate
	TLSKeyFile      string
	InitialPosition string // "", "earliest" or "latest" (driver default: earliest)
	ConsumerName    string
	Timeout         time.Duration // whole run inside the driver; 0: 1 minute
}

// Args renders the spec as driver flags.
func (s ConsumeSpec) Args() []string {
	a := []string{"consume", "--url", s.URL, "--topic", s.Topic, "--sub", s.Subscription}
	if s.Type != "" {
		a = append(a, "--type", s.Type)
	}
	if s.StickyRanges != "" {
		a = append(a, "--sticky-ranges", s.StickyRanges)
	}
	if s.Count > 0 {
		a = append(a, "--count", strconv.Itoa(s.Count))
	}
	if s.Idle > 0 {
		a = append(a, "--idle-ms", strconv.FormatInt(s.Idle.Milliseconds(), 10))
	}
	if s.NackFirst > 0 {
		a = append(a, "--nack-first", strconv.Itoa(s.NackFirst))
	}
	if s.NackDelay > 0 {
		a = append(a, "--nack-delay-ms", strconv.FormatInt(s.NackDelay.Milliseconds(), 10))
	}
	if s.Schema != "" {
		a = append(a, "--schema", s.Schema)
	}
	if s.Token != "" {
		a = append(a, "--token", s.Token)
	}
	if s.TLSTrustCerts != "" {
		a = append(a, "--tls-trust-certs", s.TLSTrustCerts)
	}
	if s.TLSCertFile != "" {
		a = append(a, "--tls-cert-file", s.TLSCertFile, "--tls-key-file", s.TLSKeyFile)
	}
	if s.InitialPosition != "" {
		a = append(a, "--initial-position", s.InitialPosition)
	}
	if s.ConsumerName != "" {
		a = append(a, "--consumer-name", s.ConsumerName)
	}
	a = append(a, "--timeout-ms", strconv.FormatInt(orDefault(s.Timeout, time.Minute).Milliseconds(), 10))
	return a
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// ---------------------------------------------------------------------------------------------
// results

// MessageID is ledger:entry:partition:batch as the client reported it (-1 where it has none).
type MessageID struct {
	Ledger, Entry    int64
	Partition, Batch int32
}

func (m MessageID) String() string {
	return fmt.Sprintf("%d:%d:%d:%d", m.Ledger, m.Entry, m.Partition, m.Batch)
}

// LedgerEntry is "ledger:entry", the part every client reports the same way.
func (m MessageID) LedgerEntry() string { return fmt.Sprintf("%d:%d", m.Ledger, m.Entry) }

// ParseMessageID parses "l:e:p:b".
func ParseMessageID(s string) (MessageID, error) {
	p := strings.Split(s, ":")
	if len(p) != 4 {
		return MessageID{}, fmt.Errorf("bad message id %q", s)
	}
	var n [4]int64
	for i, x := range p {
		v, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return MessageID{}, fmt.Errorf("bad message id %q", s)
		}
		n[i] = v
	}
	return MessageID{Ledger: n[0], Entry: n[1], Partition: int32(n[2]), Batch: int32(n[3])}, nil
}

// Ack is one acknowledged send.
type Ack struct {
	I     int
	Key   *string
	MsgID MessageID
	Seq   *int64 // reported for sync sends and explicit sequence ids; nil otherwise
}

// SendError is one failed send.
type SendError struct {
	I     int
	Key   *string
	Error string
}

// Received is one message handed to the consumer application.
type Received struct {
	I           int // payload index, -1 when the payload is not a driver payload
	Key         *string
	Props       map[string]string
	PayloadLen  int
	MsgID       MessageID
	Redelivery  int
	OrderingKey *string
	// OrderingKeyKnown is false for clients that cannot report ordering keys.
	OrderingKeyKnown bool
	Seq              *int64 // clients that expose it (Java)
	Nacked           bool
	DecodeError      string
}

// Summary is a driver's last line.
type Summary struct {
	Op           string   `json:"op"`
	Client       string   `json:"client"`
	Count        int      `json:"count"`
	Acked        int      `json:"acked"`
	Failed       int      `json:"failed"`
	Received     int      `json:"received"`
	Nacked       int      `json:"nacked"`
	Redelivered  int      `json:"redelivered"`
	TimedOut     bool     `json:"timed_out"`
	Error        string   `json:"error"`
	LastSeq      *int64   `json:"last_seq"`
	ProducerName string   `json:"producer_name"`
	ElapsedMS    int64    `json:"elapsed_ms"`
	Unobservable []string `json:"unobservable"`
	Txn          string   `json:"txn"` // produce --txn: "committed", "aborted" or "failed"
}

// ProduceResult is what a produce run printed.
type ProduceResult struct {
	Acks     []Ack
	Errors   []SendError
	Warnings []string
	Summary  Summary
	Run
}

// ConsumeResult is what a consume run printed.
type ConsumeResult struct {
	Messages []Received
	Warnings []string
	Summary  Summary
	Run
}

// Run is the process-level outcome shared by both results.
type Run struct {
	Driver   string
	Args     []string
	ExitCode int
	Elapsed  time.Duration // wall time of the process, including client start-up
	Stderr   string        // the last few KiB
	Other    []string      // stdout lines that were not driver JSON
}

// UnsupportedError is returned when the driver exits with ExitUnsupported.
type UnsupportedError struct {
	Driver, Feature, Detail string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("%s: unsupported %s: %s", e.Driver, e.Feature, e.Detail)
}

// IsUnsupported reports whether err is (or wraps) an *UnsupportedError.
func IsUnsupported(err error) bool {
	var u *UnsupportedError
	return errors.As(err, &u)
}

// RunError is returned when a driver ran but did not fully succeed (exit 1 or 2, a crash, a
// killed process). The result returned beside it holds whatever was printed.
type RunError struct {
	Driver   string
	Op       string
	ExitCode int
	Detail   string
	Stderr   string
}

func (e *RunError) Error() string {
	s := fmt.Sprintf("%s %s: exit %d: %s", e.Driver, e.Op, e.ExitCode, e.Detail)
	if e.Stderr != "" {
		s += "\n--- stderr (tail) ---\n" + e.Stderr
	}
	return s
}

// ---------------------------------------------------------------------------------------------
// running

// Command returns a command that runs the driver with args (preparing it first).
func (d *Driver) Command(ctx context.Context, args ...string) (*exec.Cmd, error) {
	argv, err := d.prepared(ctx)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, argv[0], append(argv[1:len(argv):len(argv)], args...)...)
	cmd.WaitDelay = 5 * time.Second
	return cmd, nil
}

// slack is the time a driver process gets beyond its own --timeout-ms (JVM start-up, close).
const slack = 45 * time.Second

// Produce runs one produce. On exit 3 it returns an *UnsupportedError; on other failures a
// *RunError together with the partial result.
func (d *Driver) Produce(ctx context.Context, s ProduceSpec) (*ProduceResult, error) {
	ctx, cancel := context.WithTimeout(ctx, orDefault(s.Timeout, 2*time.Minute)+slack)
	defer cancel()
	res := &ProduceResult{}
	lines, run, err := d.run(ctx, s.Args(), nil)
	res.Run = run
	if err != nil {
		return res, err
	}
	for _, l := range lines {
		switch l.kind {
		case "ack":
			var v struct {
				I     int     `json:"i"`
				Key   *string `json:"key"`
				MsgID string  `json:"msg_id"`
				Seq   *int64  `json:"seq"`
			}
			if err := json.Unmarshal(l.raw, &v); err != nil {
				return res, d.badLine("produce", run, l.raw, err)
			}
			id, err := ParseMessageID(v.MsgID)
			if err != nil {
				return res, d.badLine("produce", run, l.raw, err)
			}
			res.Acks = append(res.Acks, Ack{I: v.I, Key: v.Key, MsgID: id, Seq: v.Seq})
		case "error":
			var v SendError
			var raw struct {
				I     int     `json:"i"`
				Key   *string `json:"key"`
				Error string  `json:"error"`
			}
			if err := json.Unmarshal(l.raw, &raw); err != nil {
				return res, d.badLine("produce", run, l.raw, err)
			}
			v.I, v.Key, v.Error = raw.I, raw.Key, raw.Error
			res.Errors = append(res.Errors, v)
		case "warning":
			res.Warnings = append(res.Warnings, string(l.raw))
		case "summary":
			if err := json.Unmarshal(l.raw, &res.Summary); err != nil {
				return res, d.badLine("produce", run, l.raw, err)
			}
		}
	}
	return res, d.outcome("produce", lines, run)
}

// Consume runs one consume to completion.
func (d *Driver) Consume(ctx context.Context, s ConsumeSpec) (*ConsumeResult, error) {
	r, err := d.StartConsume(ctx, s)
	if err != nil {
		if r != nil {
			return r.result, err
		}
		return nil, err
	}
	return r.Wait()
}

// ConsumeRun is a consume started in the background; see StartConsume.
type ConsumeRun struct {
	done   chan struct{}
	result *ConsumeResult
	err    error
	cancel context.CancelFunc
}

// StartConsume starts a consume and returns once the driver has subscribed (its "ready" line),
// so that messages produced afterwards are seen even with InitialPosition "latest". Call Wait.
func (d *Driver) StartConsume(ctx context.Context, s ConsumeSpec) (*ConsumeRun, error) {
	ctx, cancel := context.WithTimeout(ctx, orDefault(s.Timeout, time.Minute)+slack)
	ready := make(chan struct{})
	var once sync.Once
	r := &ConsumeRun{done: make(chan struct{}), result: &ConsumeResult{}, cancel: cancel}
	go func() {
		defer close(r.done)
		defer cancel()
		lines, run, err := d.run(ctx, s.Args(), func(kind string) {
			if kind == "ready" {
				once.Do(func() { close(ready) })
			}
		})
		r.result.Run = run
		if err != nil {
			r.err = err
			return
		}
		r.err = d.parseConsume(r.result, lines, run)
	}()
	select {
	case <-ready:
		return r, nil
	case <-r.done:
		if r.err == nil {
			r.err = &RunError{Driver: d.Name, Op: "consume", ExitCode: r.result.ExitCode,
				Detail: "exited before subscribing: " + r.result.Summary.Error, Stderr: r.result.Stderr}
		}
		return r, r.err
	}
}

// Wait waits for the consume to end and returns its result.
func (r *ConsumeRun) Wait() (*ConsumeResult, error) {
	<-r.done
	return r.result, r.err
}

// Stop kills the consume early (its result then has whatever was printed so far).
func (r *ConsumeRun) Stop() { r.cancel() }

func (d *Driver) parseConsume(res *ConsumeResult, lines []line, run Run) error {
	for _, l := range lines {
		switch l.kind {
		case "msg":
			var v struct {
				I           int               `json:"i"`
				Key         *string           `json:"key"`
				Props       map[string]string `json:"props"`
				PayloadLen  int               `json:"payload_len"`
				MsgID       string            `json:"msg_id"`
				Redelivery  int               `json:"redelivery"`
				OrderingKey *string           `json:"ordering_key"`
				Seq         *int64            `json:"seq"`
				Nacked      bool              `json:"nacked"`
				DecodeError string            `json:"decode_error"`
			}
			if err := json.Unmarshal(l.raw, &v); err != nil {
				return d.badLine("consume", run, l.raw, err)
			}
			id, err := ParseMessageID(v.MsgID)
			if err != nil {
				return d.badLine("consume", run, l.raw, err)
			}
			var fields map[string]json.RawMessage
			_ = json.Unmarshal(l.raw, &fields)
			_, known := fields["ordering_key"]
			res.Messages = append(res.Messages, Received{I: v.I, Key: v.Key, Props: v.Props,
				PayloadLen: v.PayloadLen, MsgID: id, Redelivery: v.Redelivery, OrderingKey: v.OrderingKey,
				OrderingKeyKnown: known, Seq: v.Seq, Nacked: v.Nacked, DecodeError: v.DecodeError})
		case "warning":
			res.Warnings = append(res.Warnings, string(l.raw))
		case "summary":
			if err := json.Unmarshal(l.raw, &res.Summary); err != nil {
				return d.badLine("consume", run, l.raw, err)
			}
		}
	}
	return d.outcome("consume", lines, run)
}

func (d *Driver) badLine(op string, run Run, raw []byte, err error) error {
	return &RunError{Driver: d.Name, Op: op, ExitCode: run.ExitCode,
		Detail: fmt.Sprintf("unparsable line %q: %v", raw, err), Stderr: run.Stderr}
}

// outcome turns the exit code and the unsupported/usage/summary lines into the error contract.
func (d *Driver) outcome(op string, lines []line, run Run) error {
	var summary *line
	for i := range lines {
		switch lines[i].kind {
		case "unsupported":
			var v struct{ Feature, Detail string }
			_ = json.Unmarshal(lines[i].raw, &v)
			if run.ExitCode != ExitUnsupported {
				return &RunError{Driver: d.Name, Op: op, ExitCode: run.ExitCode,
					Detail: "unsupported line with the wrong exit code", Stderr: run.Stderr}
			}
			return &UnsupportedError{Driver: d.Name, Feature: v.Feature, Detail: v.Detail}
		case "usage_error":
			var v struct{ Error string }
			_ = json.Unmarshal(lines[i].raw, &v)
			return &RunError{Driver: d.Name, Op: op, ExitCode: run.ExitCode, Detail: "usage: " + v.Error}
		case "summary":
			summary = &lines[i]
		}
	}
	if run.ExitCode == ExitUnsupported {
		return &RunError{Driver: d.Name, Op: op, ExitCode: run.ExitCode,
			Detail: "exit 3 without an unsupported line", Stderr: run.Stderr}
	}
	if summary == nil {
		return &RunError{Driver: d.Name, Op: op, ExitCode: run.ExitCode,
			Detail: "no summary line (crashed or killed)", Stderr: run.Stderr}
	}
	if run.ExitCode != ExitOK {
		var s Summary
		_ = json.Unmarshal(summary.raw, &s)
		detail := s.Error
		if detail == "" {
			detail = fmt.Sprintf("acked %d of %d (timed out: %v)", s.Acked, s.Count, s.TimedOut)
		}
		return &RunError{Driver: d.Name, Op: op, ExitCode: run.ExitCode, Detail: detail, Stderr: run.Stderr}
	}
	return nil
}

type line struct {
	kind string
	raw  []byte
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// run executes the driver and collects its JSON lines; onLine sees each line's kind as it arrives.
// The error is non-nil only when the process could not be run at all or was killed by ctx.
func (d *Driver) run(ctx context.Context, args []string, onLine func(kind string)) ([]line, Run, error) {
	run := Run{Driver: d.Name, Args: args, ExitCode: -1}
	cmd, err := d.Command(ctx, args...)
	if err != nil {
		return nil, run, err
	}
	stderr := &tailBuffer{max: 8 << 10}
	cmd.Stderr = stderr
	if os.Getenv("DRIVERS_VERBOSE") != "" {
		cmd.Stderr = io.MultiWriter(stderr, os.Stderr)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, run, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, run, fmt.Errorf("drivers: start %s: %w", d.Name, err)
	}
	var lines []line
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var k struct {
			Kind string `json:"kind"`
		}
		if b[0] != '{' || json.Unmarshal(b, &k) != nil || k.Kind == "" {
			run.Other = append(run.Other, string(b))
			continue
		}
		lines = append(lines, line{kind: k.Kind, raw: append([]byte(nil), b...)})
		if onLine != nil {
			onLine(k.Kind)
		}
	}
	waitErr := cmd.Wait()
	run.Elapsed = time.Since(start)
	run.Stderr = stderr.String()
	if cmd.ProcessState != nil {
		run.ExitCode = cmd.ProcessState.ExitCode()
	}
	if ctx.Err() != nil {
		return lines, run, &RunError{Driver: d.Name, Op: args[0], ExitCode: run.ExitCode,
			Detail: fmt.Sprintf("killed after %v: %v (it had printed: %s)", run.Elapsed.Round(time.Millisecond), ctx.Err(), linesSeen(lines)),
			Stderr: run.Stderr}
	}
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) {
		return lines, run, fmt.Errorf("drivers: %s: %w", d.Name, waitErr)
	}
	return lines, run, nil
}

// linesSeen says how many lines of each kind a driver printed, in the order the kinds first
// came: where a killed driver was stuck (no "ready": in subscribe; "msg" lines: in receive).
func linesSeen(lines []line) string {
	var kinds []string
	n := map[string]int{}
	for _, l := range lines {
		if n[l.kind] == 0 {
			kinds = append(kinds, l.kind)
		}
		n[l.kind]++
	}
	if len(kinds) == 0 {
		return "nothing"
	}
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%d %s", n[k], k)
	}
	return strings.Join(parts, ", ")
}
