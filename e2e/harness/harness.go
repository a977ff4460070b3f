// Package harness gives end-to-end tests a real Apache Pulsar broker and the means to check
// what it stored.
//
// Contract:
//   - A test binary calls Run from its TestMain. If PULSAR_SERVICE_URL and PULSAR_ADMIN_URL are
//     set, Run uses that broker (it must already be ready); otherwise it starts one private
//     standalone broker with e2e/pulsar/pulsar.sh on free loopback ports and stops it, wiping its
//     data, when the tests end. Either way the broker's version is printed before any test runs.
//   - A broker that cannot be reached or started fails the whole binary with a message saying
//     why. Nothing here skips a test: an end-to-end test that cannot run must fail.
//   - Tests that need a broker configured differently (de-duplication broker-wide, a small
//     maxMessageSize, token authentication, a short credential-refresh check) call StartBroker
//     for a private one.
//
// Every function here may be called from any goroutine; Broker values are read-only after start.
package harness

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Broker is a running Pulsar broker as seen by a test.
type Broker struct {
	ServiceURL string // pulsar://host:port
	AdminURL   string // http://host:port
	Version    string // what /admin/v2/brokers/version answered
	// AdminToken authenticates admin calls when the broker has token authentication on.
	AdminToken string
	// TokenSecretFile is the HS256 key of a broker started with token authentication.
	TokenSecretFile string
	// ServiceURLTLS is pulsar+ssl://host:port of a broker started with Options.TLS ("" otherwise).
	ServiceURLTLS string
	// AdminURLTLS is https://localhost:port, the HTTPS web port of a broker started with
	// Options.TLS ("" otherwise).
	AdminURLTLS string
	// PIDFile holds the pid of the broker's JVM, for a broker this process started ("" otherwise).
	PIDFile string

	instance string // pulsar.sh instance name; empty for a broker we did not start
	env      []string
	http     *http.Client
}

// Options configures a broker started by StartBroker or Run.
type Options struct {
	// Dedup turns on broker-wide de-duplication.
	Dedup bool
	// MaxMessageSize sets the broker's maxMessageSize; zero keeps Pulsar's 5 MiB default.
	MaxMessageSize int
	// TokenAuth turns on JWT (HS256) token authentication.
	TokenAuth bool
	// TLSAuth turns on TLS client-certificate authentication beside token authentication, with
	// authorization on and ProxyRoles (default "proxy") as the broker's proxyRoles; needs TLS.
	// The admin API authenticates as the superuser "admin" by token.
	TLSAuth    bool
	ProxyRoles string
	// AuthRefreshSeconds sets the broker's authenticationRefreshCheckSeconds: how often it checks
	// every connection's credentials and sends AUTH_CHALLENGE on one whose token has expired.
	// Zero keeps Pulsar's 60 s default.
	AuthRefreshSeconds int
	// Instance names the broker's directory under .pulsar/run; empty picks a unique name.
	Instance string
	// Version is the Apache Pulsar server distribution to run (pulsar.sh's PULSAR_VERSION);
	// empty is pulsar.sh's default (4.0.8).
	Version string
	// TLS, when set, adds a TLS binary port with this certificate and key (PEM files made at
	// test time, e.g. by internal/testcert), trusting CA.
	TLS *TLSFiles
	// ExtraConf is appended to the broker's configuration ("key=value" lines, pulsar.sh's
	// PULSAR_EXTRA_CONF), e.g. entry filter settings.
	ExtraConf string
}

// TLSFiles are a broker's TLS certificate, key and trusted CA (PEM files).
type TLSFiles struct {
	Cert, Key, CA string
	// RequireClientCert turns on tlsRequireTrustedClientCertOnConnect.
	RequireClientCert bool
}

var (
	defaultMu     sync.Mutex
	defaultBroker *Broker
)

// Default returns the broker Run prepared for this test binary.
func Default(t testing.TB) *Broker {
	t.Helper()
	defaultMu.Lock()
	defer defaultMu.Unlock()
	if defaultBroker == nil {
		t.Fatal("harness: no broker; call harness.Run from TestMain")
	}
	return defaultBroker
}

// Run prepares the default broker, runs the tests and stops the broker if it started it.
// Use it as: func TestMain(m *testing.M) { os.Exit(harness.Run(m, harness.Options{})) }
func Run(m *testing.M, opts Options) int {
	b, err := fromEnv()
	if err == nil && b == nil {
		b, err = StartBroker(opts)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: FAIL: no real Pulsar broker: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: Apache Pulsar %s at %s (admin %s)\n", b.Version, b.ServiceURL, b.AdminURL)
	defaultMu.Lock()
	defaultBroker = b
	defaultMu.Unlock()
	code := m.Run()
	if err := b.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: stopping broker: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// fromEnv returns the broker named by PULSAR_SERVICE_URL/PULSAR_ADMIN_URL, or nil if unset.
func fromEnv() (*Broker, error) {
	svc, adm := os.Getenv("PULSAR_SERVICE_URL"), os.Getenv("PULSAR_ADMIN_URL")
	if svc == "" && adm == "" {
		return nil, nil
	}
	if svc == "" || adm == "" {
		return nil, fmt.Errorf("set both PULSAR_SERVICE_URL and PULSAR_ADMIN_URL, or neither")
	}
	b := &Broker{ServiceURL: svc, AdminURL: strings.TrimRight(adm, "/"), http: newHTTPClient()}
	if f := os.Getenv("PULSAR_ADMIN_TOKEN_FILE"); f != "" {
		tok, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("PULSAR_ADMIN_TOKEN_FILE: %w", err)
		}
		b.AdminToken = strings.TrimSpace(string(tok))
	}
	b.TokenSecretFile = os.Getenv("PULSAR_TOKEN_SECRET_FILE")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		return nil, fmt.Errorf("broker at %s is not ready: %w", adm, err)
	}
	v, err := b.get(ctx, "/admin/v2/brokers/version")
	if err != nil {
		return nil, fmt.Errorf("broker version: %w", err)
	}
	b.Version = strings.TrimSpace(string(v))
	return b, nil
}

// RepoRoot returns the repository's top directory (the one holding go.mod).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// script returns the path of e2e/pulsar/pulsar.sh.
func script() string { return filepath.Join(RepoRoot(), "e2e", "pulsar", "pulsar.sh") }

// StartBroker starts a private standalone broker on free loopback ports and waits until it is
// ready. The caller must Stop it.
//
// A port found free can be taken before the broker binds it: the standalone's own bookie and
// metadata store pick ephemeral ports as they start (seen in CI: "Failed to bind Pulsar broker
// ... Address already in use"). Such a start is tried again on new ports, twice at most; any
// other failure is returned at once. pulsar.sh tells the two apart (it exits portLostStatus).
func StartBroker(opts Options) (*Broker, error) {
	for attempt := 1; ; attempt++ {
		var inst string
		b, err := startBrokerOnce(opts, &inst)
		if err == nil || attempt == 3 || !portLost(err) {
			return b, err
		}
		fmt.Fprintf(os.Stderr, "e2e: broker %s lost a port to another process while starting; again on new ports (attempt %d)\n", inst, attempt+1)
	}
}

// portLostStatus is pulsar.sh's exit status for a start that lost a port it was given.
const portLostStatus = 3

// portLost reports whether err is pulsar.sh's start exiting with portLostStatus.
func portLost(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == portLostStatus
}

// startBrokerOnce is one attempt of StartBroker; it sets *instOut to the instance name it uses.
func startBrokerOnce(opts Options, instOut *string) (*Broker, error) {
	brokerPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	webPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	inst := opts.Instance
	if inst == "" {
		inst = fmt.Sprintf("go-%d-%d", os.Getpid(), brokerPort)
	}
	*instOut = inst
	env := append(os.Environ(),
		"PULSAR_INSTANCE="+inst,
		"PULSAR_BROKER_PORT="+strconv.Itoa(brokerPort),
		"PULSAR_WEB_PORT="+strconv.Itoa(webPort),
		"PULSAR_DEDUP="+strconv.FormatBool(opts.Dedup),
	)
	if opts.MaxMessageSize > 0 {
		env = append(env, "PULSAR_MAX_MESSAGE_SIZE="+strconv.Itoa(opts.MaxMessageSize))
	}
	if opts.Version != "" {
		env = append(env, "PULSAR_VERSION="+opts.Version)
	}
	if opts.ExtraConf != "" {
		env = append(env, "PULSAR_EXTRA_CONF="+opts.ExtraConf)
	}
	if opts.AuthRefreshSeconds > 0 {
		env = append(env, "PULSAR_AUTH_REFRESH_SECONDS="+strconv.Itoa(opts.AuthRefreshSeconds))
	}
	if opts.TLS != nil {
		tlsPort, err := FreePort()
		if err != nil {
			return nil, err
		}
		webTLSPort, err := FreePort()
		if err != nil {
			return nil, err
		}
		env = append(env, "PULSAR_TLS_PORT="+strconv.Itoa(tlsPort), "PULSAR_WEB_TLS_PORT="+strconv.Itoa(webTLSPort), "PULSAR_TLS_CERT="+opts.TLS.Cert,
			"PULSAR_TLS_KEY="+opts.TLS.Key, "PULSAR_TLS_CA="+opts.TLS.CA,
			"PULSAR_TLS_REQUIRE_CLIENT_CERT="+strconv.FormatBool(opts.TLS.RequireClientCert))
	}
	switch {
	case opts.TLSAuth:
		if opts.TLS == nil {
			return nil, fmt.Errorf("harness: TLSAuth needs TLS")
		}
		env = append(env, "PULSAR_AUTH=tls", "PULSAR_PROXY_ROLES="+cmp.Or(opts.ProxyRoles, "proxy"))
	case opts.TokenAuth:
		env = append(env, "PULSAR_AUTH=token")
	default:
		env = append(env, "PULSAR_AUTH=none")
	}
	// pulsar.sh bounds its own waits (download 900 s, readiness 180 s); this is a backstop.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := exec.CommandContext(ctx, script(), "start")
	start.Env = env
	start.Stdout, start.Stderr = os.Stderr, os.Stderr
	if err := start.Run(); err != nil {
		return nil, fmt.Errorf("%s start: %w", script(), err)
	}
	b := &Broker{instance: inst, env: env, http: newHTTPClient()}
	vars, err := b.scriptEnv(ctx)
	if err != nil {
		_ = b.Stop()
		return nil, err
	}
	b.ServiceURL, b.AdminURL = vars["PULSAR_SERVICE_URL"], vars["PULSAR_ADMIN_URL"]
	b.ServiceURLTLS, b.AdminURLTLS = vars["PULSAR_SERVICE_URL_TLS"], vars["PULSAR_ADMIN_URL_TLS"]
	b.PIDFile = vars["PULSAR_PID_FILE"]
	b.TokenSecretFile = vars["PULSAR_TOKEN_SECRET_FILE"]
	if f := vars["PULSAR_ADMIN_TOKEN_FILE"]; f != "" {
		tok, err := os.ReadFile(f)
		if err != nil {
			_ = b.Stop()
			return nil, err
		}
		b.AdminToken = strings.TrimSpace(string(tok))
	}
	v, err := b.get(ctx, "/admin/v2/brokers/version")
	if err != nil {
		_ = b.Stop()
		return nil, fmt.Errorf("broker version: %w", err)
	}
	b.Version = strings.TrimSpace(string(v))
	return b, nil
}

func (b *Broker) scriptEnv(ctx context.Context) (map[string]string, error) {
	cmd := exec.CommandContext(ctx, script(), "env")
	cmd.Env = b.env
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s env: %w", script(), err)
	}
	vars := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			vars[k] = v
		}
	}
	return vars, nil
}

// Stop stops a broker that StartBroker started and wipes its data; for a broker named by the
// environment it does nothing.
func (b *Broker) Stop() error {
	if b.instance == "" {
		return nil
	}
	return b.runScript("stop", 2*time.Minute)
}

// Kill9 crashes a broker that StartBroker started: SIGKILL, its data left as the crash left it.
// Recover starts it again.
func (b *Broker) Kill9() error {
	if b.instance == "" {
		return errors.New("harness: Kill9 needs a broker StartBroker started")
	}
	return b.runScript("kill", time.Minute)
}

// Recover starts a broker Kill9 crashed on the same ports and data, and returns once it is ready.
// A recovery whose bookie registration flaps (a Pulsar standalone race after kill -9 that fails
// new ledgers with "Not enough non-faulty bookies available") is killed and recovered again by
// pulsar.sh, which logs it; the test sees one recovery, a longer one.
func (b *Broker) Recover() error {
	if b.instance == "" {
		return errors.New("harness: Recover needs a broker StartBroker started")
	}
	return b.runScript("recover", 5*time.Minute)
}

// runScript runs pulsar.sh's command on this broker's instance, bounded by timeout.
func (b *Broker) runScript(command string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, script(), command)
	cmd.Env = b.env
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

// Token returns an HS256 token for subject, signed with the broker's secret key.
func (b *Broker) Token(subject string) (string, error) {
	key, err := b.tokenKey()
	if err != nil {
		return "", err
	}
	return SignToken(key, subject), nil
}

// TokenExpiring returns an HS256 token for subject that expires at exp (its exp claim), signed
// with the broker's secret key.
func (b *Broker) TokenExpiring(subject string, exp time.Time) (string, error) {
	key, err := b.tokenKey()
	if err != nil {
		return "", err
	}
	return SignTokenExpiring(key, subject, exp), nil
}

func (b *Broker) tokenKey() ([]byte, error) {
	if b.TokenSecretFile == "" {
		return nil, fmt.Errorf("broker %s has no token secret key", b.AdminURL)
	}
	return os.ReadFile(b.TokenSecretFile)
}

// Attach returns a Broker for a running broker the caller did not start (Stop does nothing).
func Attach(serviceURL, adminURL, adminToken string) *Broker {
	return &Broker{ServiceURL: serviceURL, AdminURL: strings.TrimRight(adminURL, "/"), AdminToken: adminToken, http: newHTTPClient()}
}

// PulsarHome returns the directory of the Pulsar distribution the harness uses (bin/pulsar,
// bin/pulsar-admin), fetching it first if needed (e2e/pulsar/pulsar.sh env).
func PulsarHome(ctx context.Context) (string, error) {
	vars, err := (&Broker{}).scriptEnv(ctx)
	if err != nil {
		return "", err
	}
	home := vars["PULSAR_HOME"]
	if home == "" {
		return "", fmt.Errorf("%s env gave no PULSAR_HOME", script())
	}
	return home, nil
}
