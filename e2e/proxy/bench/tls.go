package main

import (
	"os"
	"strconv"
	"strings"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/internal/testcert"
)

// TLS mode (-tls): a private broker with a TLS port, certificates made at start, every hop TLS.

// tlsEnv, set in our proxy's environment, names the directory of the run's certificates.
const tlsEnv = "REBATCHPROXY_BENCH_TLS"

// benchCerts are the run's certificates and the directory holding them.
type benchCerts struct {
	testcert.Files
	dir string
}

// tlsFiles and brokerPlainURL (the broker's pulsar:// URL) are set in TLS mode (main's
// goroutine, before any run).
// tlsBroker is stopped by fail as well.
var (
	tlsFiles       *benchCerts
	brokerPlainURL string
	tlsBroker      *harness.Broker
)

// certFiles names the certificates testcert.Write made in dir.
func certFiles(dir string) testcert.Files {
	f, err := testcert.Names(dir)
	if err != nil {
		fail(err)
	}
	return f
}

// startTLSBroker makes the run's certificates and starts a private broker with a TLS port.
func startTLSBroker() (*harness.Broker, error) {
	dir, err := os.MkdirTemp("", "bench-tls-")
	if err != nil {
		return nil, err
	}
	f, err := testcert.Write(dir)
	if err != nil {
		return nil, err
	}
	tlsFiles = &benchCerts{Files: f, dir: dir}
	b, err := harness.StartBroker(harness.Options{TLS: &harness.TLSFiles{Cert: f.ServerCert, Key: f.ServerKey, CA: f.CA}})
	tlsBroker = b
	if err == nil && brokerPID == 0 && b.PIDFile != "" {
		// The private broker's CPU per message, as -broker-pid gives it for a broker of one's own.
		if pid, perr := os.ReadFile(b.PIDFile); perr == nil {
			brokerPID, _ = strconv.Atoi(strings.TrimSpace(string(pid)))
		}
	}
	return b, err
}
