package compat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/e2e/drivers"
	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/internal/testcert"
	"github.com/rebatchproxy/rebatchproxy/proxy"
)

// column is one cell kind of the matrix.
type column struct {
	id, title string
	feature   drivers.Feature // a feature some drivers lack; "" when every driver must do it
}

var columns = []column{
	{"np-batched", "non-partitioned, batched", ""},
	{"np-unbatched", "non-partitioned, unbatched", ""},
	{"part-batched", "partitioned, batched", ""},
	{"part-unbatched", "partitioned, unbatched", ""},
	{"exclusive", "Exclusive", ""},
	{"shared", "Shared", ""},
	{"failover", "Failover", ""},
	{"key_shared", "Key_Shared", ""},
	{"chunked", "chunked", drivers.FeatureChunking},
	{"json", "JSON schema", drivers.FeatureSchema},
	{"nack", "nack redelivery", drivers.FeatureNack},
	{"token-good", "good token", ""},
	{"token-bad", "bad token refused", ""},
	{"redirect", "redirected lookup", ""},
	{"tls", "TLS, both hops", ""},
	{"cert-good", "TLS client certificate (proxy role)", drivers.FeatureTLSAuth},
	{"cert-bad", "untrusted certificate refused", drivers.FeatureTLSAuth},
	{"http", "http:// service URL (HTTP lookup)", drivers.FeatureHTTPLookup},
	{"https", "https:// service URL (HTTPS lookup, TLS)", drivers.FeatureHTTPLookup},
}

func columnByID(id string) column {
	for _, c := range columns {
		if c.id == id {
			return c
		}
	}
	panic("no column " + id)
}

type status int

const (
	unset status = iota
	pass
	unsupported
	fail
)

func (s status) String() string {
	return [...]string{"not run", "pass", "unsupported", "FAIL"}[s]
}

type cell struct {
	st     status
	detail string
}

// matrix collects cells from concurrent driver runs.
type matrix struct {
	mu       sync.Mutex
	cells    map[string]map[string]cell // driver -> column id -> cell
	badToken map[string]refusal         // driver -> how the bad token was refused through the proxy
}

// row records one driver's cells and reports failures on its test.
type row struct {
	t *testing.T
	d *drivers.Driver
	m *matrix
}

func (r *row) set(col string, c cell) {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	cur := r.m.cells[r.d.Name][col]
	if c.st > cur.st { // a failure is never overwritten by a later pass
		r.m.cells[r.d.Name][col] = c
	}
}

func (r *row) pass(col string) { r.set(col, cell{st: pass}) }

// status is col's result so far.
func (r *row) status(col string) status {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.m.cells[r.d.Name][col].st
}

func (r *row) fail(col, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.t.Errorf("%s: %s", columnByID(col).title, msg)
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	if len(msg) > 160 {
		msg = msg[:160] + "..."
	}
	r.set(col, cell{st: fail, detail: msg})
}

// step classifies a driver run's error for col: nil is fine (true); the driver's unsupported exit
// is recorded as unsupported when the driver table agrees the client lacks the column's feature,
// else as a failure; any other error is a failure.
func (r *row) step(col, what string, err error) bool {
	if err == nil {
		return true
	}
	var u *drivers.UnsupportedError
	if errors.As(err, &u) {
		c := columnByID(col)
		if c.feature != "" && !r.d.Supports(c.feature) && u.Feature == string(c.feature) {
			r.set(col, cell{st: unsupported, detail: u.Feature + ": " + u.Detail})
			return false
		}
		r.fail(col, "%s: the driver refused %s as unsupported (%s), but the driver table says it supports it", what, u.Feature, u.Detail)
		return false
	}
	r.fail(col, "%s: %v", what, err)
	return false
}

// env is what every driver run shares.
type env struct {
	b        *harness.Broker // the default broker
	url      string          // the proxy in front of it
	tokReady chan struct{}   // closed when the token broker and its proxy are up (or failed)
	tok      *harness.Broker
	tokURL   string // the proxy in front of the token broker
	tokErr   error
	good     string
	bad      string

	rdReady chan struct{}    // closed when the redirect (broker B, the set-up on b and B, its proxy) is ready or failed
	rd      harness.Redirect // b redirects lookups of rd.Namespace to rd.B
	rdURL   string           // a proxy in front of b that logs its lookups (Info)
	rdLogs  *harness.LogBuffer
	rdErr   error

	// Ready with rdReady: a proxy in front of broker B speaking TLS to B's TLS port, with a TLS
	// listener of its own at tlsURL (pulsar+ssl://localhost:<port>); clients trust tlsCA.
	tlsURL string
	tlsCA  string
	tlsErr error

	// Ready with certReady: broker C, with TLS client-certificate authentication and
	// authorization on (proxyRoles=proxy; public/default open to "proxy" and "client"), and a
	// proxy in front of it at certURL that requires client certificates from the test CA and
	// connects as the proxy role (its certificate "proxy") naming the client's.
	certReady chan struct{}
	cert      *harness.Broker
	certURL   string
	certs     testcert.Files
	certErr   error
}

// startCertBroker starts broker C and its proxy (see env.certReady) and returns a function that
// stops the proxy.
func startCertBroker(e *env) (func(), error) {
	c, err := harness.StartBroker(harness.Options{TLS: &harness.TLSFiles{Cert: e.certs.ServerCert, Key: e.certs.ServerKey, CA: e.certs.CA}, TLSAuth: true})
	if err != nil {
		return nil, fmt.Errorf("starting broker C: %w", err)
	}
	e.cert = c
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, role := range []string{"proxy", "client"} {
		if err := c.GrantNamespacePermission(ctx, "public/default", role, "produce", "consume"); err != nil {
			return nil, fmt.Errorf("broker C: granting %s: %w", role, err)
		}
	}
	addr, err := proxy.BrokerAddress(c.ServiceURLTLS)
	if err != nil {
		return nil, err
	}
	p, _, err := startProxyWith(c, slog.LevelWarn, func(pc *proxy.Config) {
		pc.Brokers, pc.BrokerTLS, pc.BrokerTLSTrustCertsFile = []string{addr}, true, e.certs.CA
		pc.BrokerTLSCertFile, pc.BrokerTLSKeyFile = e.certs.ProxyCert, e.certs.ProxyKey
		pc.BrokerClientAuth = &proxy.BrokerClientAuth{Method: "tls"}
		pc.TLSListen, pc.TLSCertFile, pc.TLSKeyFile, pc.TLSClientCAFile = "127.0.0.1:0", e.certs.ServerCert, e.certs.ServerKey, e.certs.CA
	})
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(p.Server.TLSAddr())
	e.certURL = "pulsar+ssl://localhost:" + port
	return p.Stop, nil
}

// startTLSProxy runs a proxy speaking TLS to b's TLS port, with a TLS listener (certs), and
// returns the listener's pulsar+ssl://localhost URL and a function that stops the proxy.
func startTLSProxy(b *harness.Broker, certs testcert.Files) (string, func(), error) {
	if b.ServiceURLTLS == "" {
		return "", nil, fmt.Errorf("broker B has no TLS port")
	}
	addr, err := proxy.BrokerAddress(b.ServiceURLTLS)
	if err != nil {
		return "", nil, err
	}
	p, _, err := startProxyWith(b, slog.LevelWarn, func(c *proxy.Config) {
		c.Brokers, c.BrokerTLS, c.BrokerTLSTrustCertsFile = []string{addr}, true, certs.CA
		c.TLSListen, c.TLSCertFile, c.TLSKeyFile = "127.0.0.1:0", certs.ServerCert, certs.ServerKey
	})
	if err != nil {
		return "", nil, err
	}
	_, port, _ := net.SplitHostPort(p.Server.TLSAddr())
	return "pulsar+ssl://localhost:" + port, p.Stop, nil
}

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9-]`)

func topicName(d *drivers.Driver, what string) string { return topicIn("public/default", d, what) }

// topicIn is a unique topic of namespace ns for driver d.
func topicIn(ns string, d *drivers.Driver, what string) string {
	n := unsafeChars.ReplaceAllString(d.Name+"-"+what, "-")
	return "persistent://" + ns + "/compat-" + n + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// interleave orders drivers so that those running at the same time are of different kinds (JVM
// start-up is the expensive part).
func interleave(all []*drivers.Driver) []*drivers.Driver {
	by := map[string][]*drivers.Driver{}
	var kinds []string
	for _, d := range all {
		if by[d.Client] == nil {
			kinds = append(kinds, d.Client)
		}
		by[d.Client] = append(by[d.Client], d)
	}
	sort.Slice(kinds, func(i, j int) bool { return kinds[i] > kinds[j] }) // python, java, go
	var out []*drivers.Driver
	for len(out) < len(all) {
		for _, k := range kinds {
			if len(by[k]) > 0 {
				out = append(out, by[k][0])
				by[k] = by[k][1:]
			}
		}
	}
	return out
}

// Given the default broker and a private one with token authentication and a 64 KiB
// maxMessageSize, each with the proxy in front of it, and a second private broker B to which the
// default broker redirects the lookups of one namespace (harness.SetUpRedirect), with another
// proxy in front of the default broker,
// when every driver runs the matrix's cells through the proxies,
// then every cell a client supports passes, and the generated matrix is written.
func TestMatrix(t *testing.T) {
	all, full := selectedDrivers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := &env{b: harness.Default(t), tokReady: make(chan struct{}), rdReady: make(chan struct{}), certReady: make(chan struct{})}
	certs, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e.certs = certs
	url, logs, stop, err := startProxy(e.b, slog.LevelWarn)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	e.url = url
	e.tlsCA = certs.CA
	e.bad = harness.SignToken([]byte("not-the-broker-key-not-the-broker-key"), "compat")
	var tokStop func()
	var tokLogs *harness.LogBuffer
	go func() {
		defer close(e.tokReady)
		e.tok, e.tokErr = harness.StartBroker(harness.Options{TokenAuth: true, MaxMessageSize: 64 << 10})
		if e.tokErr == nil {
			e.good, e.tokErr = e.tok.Token("compat")
		}
		if e.tokErr == nil {
			e.tokURL, tokLogs, tokStop, e.tokErr = startProxy(e.tok, slog.LevelWarn)
		}
	}()
	var rdStop, tlsStop func()
	defer func() {
		if tlsStop != nil {
			tlsStop()
		}
	}()
	go func() {
		defer close(e.rdReady)
		// After the token broker: two brokers starting at once on a small machine, next to the
		// first drivers, take more than twice as long each.
		<-e.tokReady
		// B also has a TLS port: the TLS column goes through a proxy speaking TLS to it.
		b, err := harness.StartBroker(harness.Options{TLS: &harness.TLSFiles{Cert: certs.ServerCert, Key: certs.ServerKey, CA: certs.CA}})
		if err != nil {
			e.rdErr = fmt.Errorf("starting broker B: %w", err)
			return
		}
		e.rd.B = b
		e.tlsURL, tlsStop, e.tlsErr = startTLSProxy(b, certs)
		if e.rd, e.rdErr = harness.SetUpRedirect(t, e.b, b); e.rdErr != nil {
			return
		}
		// The proxy knows only the default broker; it learns B from the lookup answers.
		e.rdURL, e.rdLogs, rdStop, e.rdErr = startProxy(e.b, slog.LevelInfo)
	}()
	var certStop func()
	go func() {
		defer close(e.certReady)
		<-e.rdReady // one broker starting at a time (see B)
		certStop, e.certErr = startCertBroker(e)
	}()
	defer func() {
		<-e.certReady
		if e.certErr != nil {
			t.Errorf("certificate broker: %v", e.certErr)
		}
		if certStop != nil {
			certStop()
		}
		if e.cert != nil {
			if err := e.cert.Stop(); err != nil {
				t.Errorf("stopping broker C: %v", err)
			}
		}
	}()
	defer func() {
		<-e.rdReady
		if e.rdErr != nil {
			t.Errorf("lookup redirect: %v", e.rdErr)
		}
		if rdStop != nil {
			rdStop()
		}
		if e.rd.B != nil {
			if err := e.rd.B.Stop(); err != nil {
				t.Errorf("stopping broker B: %v", err)
			}
		}
		if t.Failed() && e.rdLogs != nil {
			t.Logf("proxy log (lookup redirects):\n%s", e.rdLogs)
		}
	}()
	defer func() {
		<-e.tokReady
		if tokStop != nil {
			tokStop()
		}
		if e.tok != nil {
			if err := e.tok.Stop(); err != nil {
				t.Errorf("stopping the token broker: %v", err)
			}
		}
		if t.Failed() {
			t.Logf("proxy log (default broker):\n%s", logs)
			if tokLogs != nil {
				t.Logf("proxy log (token broker):\n%s", tokLogs)
			}
		}
	}()

	m := runRows(ctx, t, all, columns, func(ctx context.Context, r *row) { runDriver(ctx, r, e) })

	text := render(m, all, e.b.Version)
	if !full {
		t.Logf("partial run (-drivers); MATRIX.md not written:\n%s", text)
		return
	}
	path := filepath.Join(packageDir(), "MATRIX.md")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
	if *updateReadme {
		rp := filepath.Join(harness.RepoRoot(), "README.md")
		readme, err := os.ReadFile(rp)
		if err != nil {
			t.Fatal(err)
		}
		out, ok := splice(string(readme), text)
		if !ok {
			t.Fatalf("README.md has no compat-matrix markers (%q ... %q)", readmeBegin, readmeEnd)
		}
		if err := os.WriteFile(rp, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("updated %s", rp)
	}
}

// selectedDrivers returns the drivers to run (all, or -drivers) prepared, and whether that is
// all of them.
func selectedDrivers(t *testing.T) ([]*drivers.Driver, bool) {
	all, err := drivers.All()
	if err != nil {
		t.Fatal(err)
	}
	full := *onlyDrivers == ""
	if !full {
		all = nil
		for _, n := range strings.Split(*onlyDrivers, ",") {
			d, err := drivers.ByName(strings.TrimSpace(n))
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, d)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, d := range all {
		if err := d.Prepare(ctx); err != nil {
			t.Fatalf("%v (run e2e/drivers/setup.sh first)", err)
		}
	}
	return all, full
}

// runRows runs every driver's row (run fills its cells), -compat.parallel at a time, each as
// a subtest bounded by 5 minutes, and fails the cells of cols a row left without a result.
func runRows(ctx context.Context, t *testing.T, all []*drivers.Driver, cols []column, run func(context.Context, *row)) *matrix {
	m := &matrix{cells: map[string]map[string]cell{}, badToken: map[string]refusal{}}
	for _, d := range all {
		m.cells[d.Name] = map[string]cell{}
	}
	start := time.Now()
	sem := make(chan struct{}, max(1, *parallel))
	var wg sync.WaitGroup
	for _, d := range interleave(all) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			t.Run(d.Name, func(t *testing.T) {
				r := &row{t: t, d: d, m: m}
				dctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
				defer cancel()
				t0 := time.Now()
				run(dctx, r)
				for _, c := range cols {
					m.mu.Lock()
					st := m.cells[d.Name][c.id].st
					m.mu.Unlock()
					if st == unset {
						r.fail(c.id, "no result recorded")
					}
				}
				t.Logf("%s: %v", d.Name, time.Since(t0).Round(time.Millisecond))
			})
		}()
	}
	wg.Wait()
	t.Logf("all drivers: %v", time.Since(start).Round(time.Second))
	return m
}

// runDriver runs one driver's groups of cells: the groups that use the default broker, the one
// that uses the token broker, the redirected lookup and TLS at the same time, then the
// subscription group, whose idle consumers are timing-sensitive, then the certificate cells.
func runDriver(ctx context.Context, r *row, e *env) {
	runGroups(ctx, r, e, produceConsume(0), produceConsume(3), schemaNack, tokenGroup, redirected, overTLS, httpLookup)
	subscriptions(ctx, r, e)
	// Last and alone: on two cores, three more client processes per driver next to the groups
	// above (broker C's cells) made JVM clients miss their timeouts there.
	certGroup(ctx, r, e)
}

// byRun splits consumed messages by their "run" property.
func byRun(msgs []drivers.Received, run string) []drivers.Received {
	var out []drivers.Received
	for _, m := range msgs {
		if m.Props["run"] == run {
			out = append(out, m)
		}
	}
	return out
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// checkDelivered says what is wrong with msgs as the delivery of payload indices 0..n-1 with
// keys key-<i mod keys> and payloads of size bytes: each exactly once, intact, and in order:
// none, per key, or in total.
func checkDelivered(msgs []drivers.Received, n, keys, size int, order orderKind) string {
	seen := make([]int, n)
	last := map[string]int{}
	prev := -1
	for _, m := range msgs {
		if m.I < 0 || m.I >= n {
			return fmt.Sprintf("message with payload index %d (decode error %q)", m.I, m.DecodeError)
		}
		seen[m.I]++
		if keys > 0 {
			if want := fmt.Sprintf("key-%d", m.I%keys); deref(m.Key) != want {
				return fmt.Sprintf("message %d has key %s, want %s", m.I, deref(m.Key), want)
			}
		}
		if size > 0 && m.PayloadLen != size {
			return fmt.Sprintf("message %d has %d bytes, want %d", m.I, m.PayloadLen, size)
		}
		if p, ok := last[deref(m.Key)]; ok && m.I < p && order >= perKey {
			return fmt.Sprintf("key %s: message %d after %d", deref(m.Key), m.I, p)
		}
		last[deref(m.Key)] = m.I
		if order == total && m.I < prev {
			return fmt.Sprintf("message %d after %d", m.I, prev)
		}
		prev = m.I
	}
	for i, s := range seen {
		if s != 1 {
			return fmt.Sprintf("message %d delivered %d times", i, s)
		}
	}
	return ""
}

type orderKind int

const (
	anyOrder orderKind = iota
	perKey
	total
)

// orderFor is the order one consumer sees on a topic with or without partitions.
func orderFor(partitions int) orderKind {
	if partitions > 0 {
		return perKey
	}
	return total
}

func ackCount(p *drivers.ProduceResult) int {
	if p == nil {
		return 0
	}
	return len(p.Acks)
}

// storedEntries reads the entries of topic (every partition of a partitioned one).
func storedEntries(ctx context.Context, b *harness.Broker, topic string, partitions int) ([]harness.StoredEntry, error) {
	if partitions == 0 {
		return b.StoredEntries(ctx, topic)
	}
	var all []harness.StoredEntry
	for p := 0; p < partitions; p++ {
		es, err := b.StoredEntries(ctx, fmt.Sprintf("%s-partition-%d", topic, p))
		if err != nil {
			return nil, err
		}
		all = append(all, es...)
	}
	return all, nil
}

// produceConsume: a batched and an unbatched produce of keyed messages to one topic
// (partitioned when partitions > 0), one exclusive consume of all of them, and the broker's
// stored entries showing batching on for the first and off for the second.
func produceConsume(partitions int) func(context.Context, *row, *env) {
	return func(ctx context.Context, r *row, e *env) {
		const nB, nS, keys, size = 40, 12, 5, 64
		colB, colS, what := "np-batched", "np-unbatched", "np"
		if partitions > 0 {
			colB, colS, what = "part-batched", "part-unbatched", "part"
		}
		topic := topicName(r.d, what)
		if partitions > 0 {
			if err := e.b.CreateTopic(ctx, topic, partitions); err != nil {
				r.fail(colB, "create topic: %v", err)
				r.fail(colS, "create topic: %v", err)
				return
			}
		}
		batched, err := r.d.Produce(ctx, drivers.ProduceSpec{URL: e.url, Topic: topic, Count: nB,
			Batching: drivers.Bool(true), BatchMaxMessages: 10, BatchDelay: drivers.Int(50),
			KeyMode: "seq", Keys: keys, Properties: "run=batched", Size: size, Timeout: time.Minute})
		okB := r.step(colB, "batched produce", err)
		single, err := r.d.Produce(ctx, drivers.ProduceSpec{URL: e.url, Topic: topic, Count: nS,
			Batching: drivers.Bool(false), KeyMode: "seq", Keys: keys, Properties: "run=single", Size: size,
			Timeout: time.Minute})
		okS := r.step(colS, "unbatched produce", err)
		want := ackCount(batched) + ackCount(single)
		got, err := r.d.Consume(ctx, drivers.ConsumeSpec{URL: e.url, Topic: topic, Subscription: "c",
			Type: "exclusive", Count: want, InitialPosition: "earliest", Timeout: time.Minute})
		if err != nil {
			r.fail(colB, "consume: %v", err)
			r.fail(colS, "consume: %v", err)
			return
		}
		entries, err := storedEntries(ctx, e.b, topic, partitions)
		if err != nil {
			r.fail(colB, "reading stored entries: %v", err)
			r.fail(colS, "reading stored entries: %v", err)
			return
		}
		delivery := map[string]string{
			"batched": checkDelivered(byRun(got.Messages, "batched"), nB, keys, size, orderFor(partitions)),
			"single":  checkDelivered(byRun(got.Messages, "single"), nS, keys, size, orderFor(partitions)),
		}
		// Entries per run, from the messages' own properties. A batch that happens to hold one
		// message may be stored in the non-batch format (Java 3.0 and later do that).
		multi, bad := map[string]int{}, map[string]int{}
		for _, en := range entries {
			runs := map[string]bool{}
			for _, sm := range en.Messages {
				runs[sm.Properties["run"]] = true
			}
			for run := range runs {
				if en.NumMessages > 1 {
					multi[run]++
				}
				if len(runs) > 1 { // two producer processes never share an entry
					bad[run]++
				}
			}
		}
		if okB {
			switch {
			case len(batched.Acks) != nB:
				r.fail(colB, "%d of %d sends acknowledged", len(batched.Acks), nB)
			case delivery["batched"] != "":
				r.fail(colB, "delivery: %s", delivery["batched"])
			case multi["batched"] == 0 || bad["batched"] > 0:
				r.fail(colB, "the broker stored %d entries of several messages, %d mixing runs (%d entries in all)", multi["batched"], bad["batched"], len(entries))
			default:
				r.pass(colB)
			}
		}
		if okS {
			switch {
			case len(single.Acks) != nS:
				r.fail(colS, "%d of %d sends acknowledged", len(single.Acks), nS)
			case delivery["single"] != "":
				r.fail(colS, "delivery: %s", delivery["single"])
			case multi["single"] > 0 || bad["single"] > 0:
				r.fail(colS, "the broker stored unbatched messages %d times in an entry of several", multi["single"]+bad["single"])
			default:
				r.pass(colS)
			}
		}
	}
}

// schemaNack: JSON-schema messages, consumed with the schema; the first three received are
// negative-acked and must come again. The broker must have registered a JSON schema.
func schemaNack(ctx context.Context, r *row, e *env) {
	const n, nack = 10, 3
	topic := topicName(r.d, "json")
	_, err := r.d.Produce(ctx, drivers.ProduceSpec{URL: e.url, Topic: topic, Count: n, Schema: "json", Size: 30,
		Timeout: time.Minute})
	if !r.step("json", "produce", err) {
		if drivers.IsUnsupported(err) && !r.d.Supports(drivers.FeatureNack) {
			// The cell's JSON records cannot be sent, and the driver could not nack them anyway.
			r.set("nack", cell{st: unsupported, detail: string(drivers.FeatureNack) + ": " + r.d.Unsupported()[drivers.FeatureNack]})
		} else {
			r.fail("nack", "produce failed (see the JSON schema cell)")
		}
		return
	}
	got, err := r.d.Consume(ctx, drivers.ConsumeSpec{URL: e.url, Topic: topic, Subscription: "n", Schema: "json",
		Count: n, NackFirst: nack, NackDelay: 200 * time.Millisecond, Timeout: time.Minute})
	if err != nil {
		r.fail("json", "consume: %v", err)
		r.fail("nack", "consume: %v", err)
		return
	}
	acked := make([]int, n)
	var nacked []int
	decodeErr := ""
	for _, m := range got.Messages {
		if m.DecodeError != "" || m.I < 0 || m.I >= n {
			decodeErr = fmt.Sprintf("message %d: decode error %q", m.I, m.DecodeError)
			continue
		}
		if m.Nacked {
			nacked = append(nacked, m.I)
		} else {
			acked[m.I]++
		}
	}
	schemaType, err := registeredSchemaType(ctx, e.b, topic)
	switch {
	case err != nil:
		r.fail("json", "reading the registered schema: %v", err)
	case schemaType != "JSON":
		r.fail("json", "the broker registered schema type %q, want JSON", schemaType)
	case decodeErr != "":
		r.fail("json", "%s", decodeErr)
	default:
		r.pass("json")
	}
	once := true
	for _, a := range acked {
		once = once && a == 1
	}
	switch {
	case fmt.Sprint(nacked) != "[0 1 2]":
		r.fail("nack", "negative-acked %v, want [0 1 2]", nacked)
	case !once:
		r.fail("nack", "acknowledged per index %v, want each once (the nacked ones after redelivery)", acked)
	case got.Summary.Received != n+nack:
		r.fail("nack", "received %d messages, want %d", got.Summary.Received, n+nack)
	default:
		r.pass("nack")
	}
}

// tokenGroup uses the private broker (token authentication, 64 KiB maxMessageSize): chunked
// messages and a good token through the proxy, and a bad token refused through the proxy with
// the error the same client reports when it connects to the broker directly.
func tokenGroup(ctx context.Context, r *row, e *env) {
	select {
	case <-e.tokReady:
	case <-ctx.Done():
		for _, col := range []string{"chunked", "token-good", "token-bad"} {
			r.fail(col, "timed out waiting for the token-auth broker")
		}
		return
	}
	if e.tokErr != nil {
		for _, col := range []string{"chunked", "token-good", "token-bad"} {
			r.fail(col, "no token-auth broker with a proxy: %v", e.tokErr)
		}
		return
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); chunked(ctx, r, e) }()
	go func() { defer wg.Done(); goodToken(ctx, r, e) }()
	go func() { defer wg.Done(); badToken(ctx, r, e) }()
	wg.Wait()
}

func chunked(ctx context.Context, r *row, e *env) {
	// Messages of about 2.3 times the broker's maxMessageSize: the client learns the limit from
	// CONNECTED, relayed by the proxy, and splits each message into 3 chunks.
	const n, size = 3, 150000
	topic := topicName(r.d, "chunk")
	_, err := r.d.Produce(ctx, drivers.ProduceSpec{URL: e.tokURL, Token: e.good, Topic: topic, Count: n, Size: size,
		Chunking: true, KeyMode: "seq", Keys: 2, Timeout: time.Minute})
	if !r.step("chunked", "produce", err) {
		return
	}
	got, err := r.d.Consume(ctx, drivers.ConsumeSpec{URL: e.tokURL, Token: e.good, Topic: topic, Subscription: "c",
		Count: n, Timeout: time.Minute})
	if err != nil {
		r.fail("chunked", "consume: %v", err)
		return
	}
	entries, err := e.tok.StoredEntries(ctx, topic)
	if err != nil {
		r.fail("chunked", "reading stored entries: %v", err)
		return
	}
	uuids := map[string]int{}
	for _, en := range entries {
		if en.ChunkID >= 0 {
			uuids[en.UUID]++
		}
	}
	chunksOK := len(uuids) == n
	for _, c := range uuids {
		chunksOK = chunksOK && c >= 2
	}
	switch {
	case checkDelivered(got.Messages, n, 2, size, total) != "":
		r.fail("chunked", "delivery: %s", checkDelivered(got.Messages, n, 2, size, total))
	case !chunksOK:
		r.fail("chunked", "the broker stored %d entries, chunks per message %v: not chunked", len(entries), uuids)
	default:
		r.pass("chunked")
	}
}

// overTLS produces and consumes through a proxy's TLS listener (pulsar+ssl://, the test CA
// trusted, hostname verified) that speaks TLS to broker B's TLS port.
func overTLS(ctx context.Context, r *row, e *env) {
	select {
	case <-e.rdReady:
	case <-ctx.Done():
		r.fail("tls", "timed out waiting for broker B and its TLS proxy")
		return
	}
	if e.rdErr != nil || e.tlsErr != nil {
		r.fail("tls", "no TLS broker with a TLS proxy: %v %v", e.rdErr, e.tlsErr)
		return
	}
	roundTrip(ctx, r, "tls", drivers.ProduceSpec{URL: e.tlsURL, TLSTrustCerts: e.tlsCA, Topic: topicName(r.d, "tls")}, "t")
}

// certGroup runs the client-certificate cells against broker C through its proxy: a client
// certificate the proxy's CA signed ("client", granted) round-trips, one from an unknown CA is
// refused before any send is acknowledged.
func certGroup(ctx context.Context, r *row, e *env) {
	select {
	case <-e.certReady:
	case <-ctx.Done():
		r.fail("cert-good", "timed out waiting for broker C and its proxy")
		r.fail("cert-bad", "timed out waiting for broker C and its proxy")
		return
	}
	if e.certErr != nil {
		r.fail("cert-good", "no certificate broker with a proxy: %v", e.certErr)
		r.fail("cert-bad", "no certificate broker with a proxy: %v", e.certErr)
		return
	}
	roundTrip(ctx, r, "cert-good", drivers.ProduceSpec{URL: e.certURL, TLSTrustCerts: e.certs.CA, TLSCertFile: e.certs.ClientCert,
		TLSKeyFile: e.certs.ClientKey, Topic: topicName(r.d, "cert")}, "c")
	p, err := r.d.Produce(ctx, drivers.ProduceSpec{URL: e.certURL, TLSTrustCerts: e.certs.CA, TLSCertFile: e.certs.UntrustedClientCert,
		TLSKeyFile: e.certs.UntrustedClientKey, Topic: topicName(r.d, "certbad"), Count: 1, SendTimeout: drivers.Int(5000), Timeout: 10 * time.Second})
	var re *drivers.RunError
	switch {
	case drivers.IsUnsupported(err):
		r.step("cert-bad", "produce with an untrusted certificate", err)
	case err == nil:
		r.fail("cert-bad", "an untrusted certificate's producer was created and its send acknowledged")
	case !errors.As(err, &re):
		r.fail("cert-bad", "%v", err)
	case p != nil && len(p.Acks) > 0:
		r.fail("cert-bad", "%d sends acknowledged with an untrusted certificate", len(p.Acks))
	default:
		r.pass("cert-bad")
	}
}

func goodToken(ctx context.Context, r *row, e *env) {
	roundTrip(ctx, r, "token-good", drivers.ProduceSpec{URL: e.tokURL, Token: e.good, Topic: topicName(r.d, "auth")}, "a")
}

// roundTrip produces 10 messages as p says (its URL, credentials and topic) and consumes them the
// same way on subscription sub: cell col passes when every send is acknowledged and every
// message delivered once, in order.
func roundTrip(ctx context.Context, r *row, col string, p drivers.ProduceSpec, sub string) {
	const n = 10
	p.Count, p.Timeout = n, time.Minute
	res, err := r.d.Produce(ctx, p)
	if !r.step(col, "produce", err) {
		return
	}
	got, err := r.d.Consume(ctx, drivers.ConsumeSpec{URL: p.URL, Token: p.Token, TLSTrustCerts: p.TLSTrustCerts,
		TLSCertFile: p.TLSCertFile, TLSKeyFile: p.TLSKeyFile, Topic: p.Topic, Subscription: sub, Count: n, Timeout: time.Minute})
	if !r.step(col, "consume", err) {
		return
	}
	if len(res.Acks) != n {
		r.fail(col, "%d of %d sends acknowledged", len(res.Acks), n)
	} else if s := checkDelivered(got.Messages, n, 0, 0, total); s != "" {
		r.fail(col, "delivery: %s", s)
	} else {
		r.pass(col)
	}
}

var (
	addrPattern = regexp.MustCompile(`(localhost|127\.0\.0\.1|\[::1\]|/127\.0\.0\.1):\d+`)
	idPattern   = regexp.MustCompile(`0x[0-9a-fA-F]+`)
	numPattern  = regexp.MustCompile(`\b\d{3,}\b`)
)

// normalizeError removes what differs between two connections of one client (addresses,
// ports, connection ids, request ids) from an error message.
func normalizeError(s string, urls ...string) string {
	for _, u := range urls {
		s = strings.ReplaceAll(s, u, "<service-url>")
	}
	s = addrPattern.ReplaceAllString(s, "<addr>")
	s = idPattern.ReplaceAllString(s, "<id>")
	return numPattern.ReplaceAllString(s, "<n>")
}

// brokerAuthError is the broker's own refusal of a bad token (ERROR AuthenticationError,
// "Failed to authenticate"), as a client's error or log shows it.
var brokerAuthError = regexp.MustCompile(`(?i)authenticationerror|failed to authenticate|authentication ?exception`)

// refusal is how a client reported a refused bad token: its error, and whether the broker's own
// authentication error shows in the error or in the client's log.
type refusal struct {
	report     string
	brokerSeen bool
}

func badToken(ctx context.Context, r *row, e *env) {
	attempt := func(url string) (refusal, error) {
		p, err := r.d.Produce(ctx, drivers.ProduceSpec{URL: url, Token: e.bad, Topic: topicName(r.d, "badtoken"),
			Count: 1, SendTimeout: drivers.Int(5000), Timeout: 10 * time.Second})
		if err == nil {
			return refusal{}, fmt.Errorf("%s: the producer was created and its send acknowledged", url)
		}
		var re *drivers.RunError
		if !errors.As(err, &re) {
			return refusal{}, err
		}
		if p != nil && len(p.Acks) > 0 {
			return refusal{}, fmt.Errorf("%s: %d sends acknowledged with a bad token", url, len(p.Acks))
		}
		return refusal{report: p.Summary.Error, brokerSeen: brokerAuthError.MatchString(p.Summary.Error + "\n" + p.Stderr)}, nil
	}
	var direct, proxied refusal
	var errD, errP error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); direct, errD = attempt(e.tok.ServiceURL) }()
	go func() { defer wg.Done(); proxied, errP = attempt(e.tokURL) }()
	wg.Wait()
	if !r.step("token-bad", "direct", errD) || !r.step("token-bad", "through the proxy", errP) {
		return
	}
	nd := normalizeError(direct.report, e.tok.ServiceURL, e.tokURL)
	np := normalizeError(proxied.report, e.tok.ServiceURL, e.tokURL)
	r.m.mu.Lock()
	r.m.badToken[r.d.Name] = refusal{report: np, brokerSeen: proxied.brokerSeen}
	r.m.mu.Unlock()
	// Java clients return the broker's AuthenticationError; Go clients report a connection
	// error and log the broker's error; Python (C++) clients report a timeout or ConnectError
	// and do not show the broker's text at all. Either way the proxied report must be the direct
	// one, and the broker's error must show through the proxy exactly when it shows directly.
	// (e2e/proxy's TestTokenAuthThroughProxy compares the ERROR frames themselves.)
	switch {
	case strings.TrimSpace(direct.report) == "":
		r.fail("token-bad", "the direct attempt failed without an error message")
	case nd != np:
		r.fail("token-bad", "through the proxy the client reports %q, directly %q", np, nd)
	case proxied.brokerSeen != direct.brokerSeen:
		r.fail("token-bad", "the broker's authentication error shows in the client's error or log through the proxy: %v, directly: %v", proxied.brokerSeen, direct.brokerSeen)
	default:
		r.pass("token-bad")
	}
}

// subscriptions: consumers of the four subscription types on one topic, all subscribed before
// one unbatched producer sends keyed messages. Exclusive: the consumer gets everything in order,
// and a second consumer on its subscription is refused. Shared: two consumers get each message
// once between them. Failover: one of two consumers gets everything in order, the other
// nothing. Key_Shared: two consumers get each message once, each key at one consumer only, in
// order per key.
func subscriptions(ctx context.Context, r *row, e *env) {
	const n, keys = 30, 6
	topic := topicName(r.d, "subs")
	type cons struct {
		col, sub, typ string
		run           *drivers.ConsumeRun
	}
	cs := []*cons{{col: "exclusive", sub: "ex", typ: "exclusive"},
		{col: "shared", sub: "sh", typ: "shared"}, {col: "shared", sub: "sh", typ: "shared"},
		{col: "failover", sub: "fo", typ: "failover"}, {col: "failover", sub: "fo", typ: "failover"},
		{col: "key_shared", sub: "ks", typ: "key_shared"}, {col: "key_shared", sub: "ks", typ: "key_shared"}}
	startErr := make([]error, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := drivers.ConsumeSpec{URL: e.url, Topic: topic, Subscription: c.sub, Type: c.typ,
				ConsumerName: fmt.Sprintf("%s-%d", c.sub, i), InitialPosition: "earliest", Timeout: 90 * time.Second}
			if c.typ == "exclusive" {
				spec.Count = n
			} else {
				// Stop after this long without a message. It must cover the exclusive probe's and
				// then the producer's start-up after everyone subscribed (two JVMs, one after the
				// other, on a loaded 2-core machine: 12 s and then 25 s were seen to be too short).
				spec.Idle = 45 * time.Second
			}
			c.run, startErr[i] = r.d.StartConsume(ctx, spec)
		}()
	}
	wg.Wait()
	failed := map[string]bool{}
	for i, c := range cs {
		if startErr[i] != nil {
			r.fail(c.col, "subscribe: %v", startErr[i])
			failed[c.col] = true
		}
	}
	defer func() {
		for _, c := range cs {
			if c.run != nil {
				c.run.Stop()
			}
		}
	}()
	// A second consumer on the exclusive subscription must be refused by the broker. It runs
	// before the producer: once the producer has sent, the first exclusive consumer may have its
	// messages and leave, and a probe after that would rightly be accepted.
	probe, perr := r.d.StartConsume(ctx, drivers.ConsumeSpec{URL: e.url, Topic: topic, Subscription: "ex",
		Type: "exclusive", ConsumerName: "ex-second", Count: 1, Timeout: 20 * time.Second})
	if perr == nil {
		probe.Stop()
		r.fail("exclusive", "a second consumer subscribed to the exclusive subscription")
		failed["exclusive"] = true
	} else if l := strings.ToLower(perr.Error()); !strings.Contains(l, "consumerbusy") && !strings.Contains(l, "already connected") {
		r.fail("exclusive", "the second exclusive consumer failed, but not as busy: %v", perr)
		failed["exclusive"] = true
	}

	p, err := r.d.Produce(ctx, drivers.ProduceSpec{URL: e.url, Topic: topic, Count: n, Batching: drivers.Bool(false),
		KeyMode: "seq", Keys: keys, Timeout: time.Minute})
	if err != nil || len(p.Acks) != n {
		for _, col := range []string{"exclusive", "shared", "failover", "key_shared"} {
			r.fail(col, "produce: %d acks, %v", ackCount(p), err)
		}
		return
	}
	results := map[string][][]drivers.Received{}
	for _, c := range cs {
		if c.run == nil {
			continue
		}
		res, err := c.run.Wait()
		if err != nil {
			r.fail(c.col, "consume: %v", err)
			failed[c.col] = true
			continue
		}
		results[c.col] = append(results[c.col], res.Messages)
	}
	merged := func(col string) []drivers.Received {
		var all []drivers.Received
		for _, ms := range results[col] {
			all = append(all, ms...)
		}
		return all
	}
	if !failed["exclusive"] {
		if s := checkDelivered(merged("exclusive"), n, keys, 0, total); s != "" {
			r.fail("exclusive", "delivery: %s", s)
		} else {
			r.pass("exclusive")
		}
	}
	if !failed["shared"] {
		if s := checkDelivered(merged("shared"), n, keys, 0, anyOrder); s != "" {
			r.fail("shared", "delivery: %s", s)
		} else {
			r.t.Logf("shared: %d + %d messages", len(results["shared"][0]), len(results["shared"][1]))
			r.pass("shared")
		}
	}
	if !failed["failover"] {
		a, b := results["failover"][0], results["failover"][1]
		if len(a) < len(b) {
			a, b = b, a
		}
		if s := checkDelivered(a, n, keys, 0, total); s != "" || len(b) != 0 {
			r.fail("failover", "active consumer: %q; the other consumer got %d messages", s, len(b))
		} else {
			r.pass("failover")
		}
	}
	if !failed["key_shared"] {
		owner := map[string]int{}
		split := ""
		for ci, ms := range results["key_shared"] {
			for _, m := range ms {
				k := deref(m.Key)
				if o, ok := owner[k]; ok && o != ci {
					split = fmt.Sprintf("key %s reached both consumers", k)
				}
				owner[k] = ci
			}
		}
		if s := checkDelivered(merged("key_shared"), n, keys, 0, perKey); s != "" {
			r.fail("key_shared", "delivery: %s", s)
		} else if split != "" {
			r.fail("key_shared", "%s", split)
		} else {
			r.t.Logf("key_shared: %d + %d messages", len(results["key_shared"][0]), len(results["key_shared"][1]))
			r.pass("key_shared")
		}
	}
}

// redirected: through the proxy in front of the default broker, which redirects the lookups of
// the topic's namespace to broker B, produce n keyed messages and consume them. Passes when
// every send is acknowledged, each message is delivered once in order, B stored all n, and the
// proxy's log shows it followed the redirect for the topic (the producer's and the consumer's
// lookups: at least 2) and never failed to.
func redirected(ctx context.Context, r *row, e *env) {
	const col, n, keys, size = "redirect", 10, 2, 32
	select {
	case <-e.rdReady:
	case <-ctx.Done():
		r.fail(col, "timed out waiting for the lookup redirect set-up")
		return
	}
	if e.rdErr != nil {
		r.fail(col, "no lookup redirect from the default broker to broker B: %v", e.rdErr)
		return
	}
	topic := topicIn(e.rd.Namespace, r.d, "redirect")
	p, err := r.d.Produce(ctx, drivers.ProduceSpec{URL: e.rdURL, Topic: topic, Count: n, KeyMode: "seq", Keys: keys,
		Size: size, Timeout: time.Minute})
	if !r.step(col, "produce", err) {
		return
	}
	got, err := r.d.Consume(ctx, drivers.ConsumeSpec{URL: e.rdURL, Topic: topic, Subscription: "r", Count: n,
		InitialPosition: "earliest", Timeout: time.Minute})
	if !r.step(col, "consume", err) {
		return
	}
	entries, err := e.rd.B.StoredEntries(ctx, topic)
	if err != nil {
		r.fail(col, "reading the topic on broker B: %v", err)
		return
	}
	stored := 0
	for _, en := range entries {
		stored += en.NumMessages
	}
	followed, failed := 0, 0
	for _, l := range strings.Split(e.rdLogs.String(), "\n") {
		if !strings.Contains(l, topic) {
			continue
		}
		switch {
		case strings.Contains(l, "lookup redirect followed") && strings.Contains(l, e.rd.B.ServiceURL):
			followed++
		case strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR"):
			failed++
		}
	}
	switch {
	case len(p.Acks) != n:
		r.fail(col, "%d of %d sends acknowledged", len(p.Acks), n)
	case checkDelivered(got.Messages, n, keys, size, total) != "":
		r.fail(col, "delivery: %s", checkDelivered(got.Messages, n, keys, size, total))
	case stored != n:
		r.fail(col, "broker B stored %d messages in %d entries, want %d", stored, len(entries), n)
	case followed < 2 || failed > 0:
		r.fail(col, "the proxy followed the redirect to B %d times for the topic (want at least 2) and logged %d warnings for it", followed, failed)
	default:
		r.t.Logf("redirected lookup: B stored %d messages in %d entries; the proxy followed %d redirects", stored, len(entries), followed)
		r.pass(col)
	}
}

// registeredSchemaType asks the broker's admin API which schema type topic has.
func registeredSchemaType(ctx context.Context, b *harness.Broker, topic string) (string, error) {
	path := "/admin/v2/schemas/" + strings.TrimPrefix(topic, "persistent://") + "/schema"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.AdminURL+path, nil)
	if err != nil {
		return "", err
	}
	if b.AdminToken != "" {
		req.Header.Set("Authorization", "Bearer "+b.AdminToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: HTTP %d: %s", path, resp.StatusCode, body)
	}
	var v struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return "", fmt.Errorf("GET %s: %w", path, err)
	}
	return v.Type, nil
}
