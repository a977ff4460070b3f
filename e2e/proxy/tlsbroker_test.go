package proxy_test

import (
	"testing"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/internal/testcert"
	"github.com/rebatchproxy/rebatchproxy/proxy"
)

// startTLSBroker makes certificates now and starts a private broker with a TLS port serving
// them (opts.TLS is set here); it returns the certificates, the broker (stopped at cleanup) and
// the host:port of its TLS port.
func startTLSBroker(t *testing.T, opts harness.Options) (testcert.Files, *harness.Broker, string) {
	t.Helper()
	files, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	opts.TLS = &harness.TLSFiles{Cert: files.ServerCert, Key: files.ServerKey, CA: files.CA}
	b, err := harness.StartBroker(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	addr, err := proxy.BrokerAddress(b.ServiceURLTLS)
	if err != nil {
		t.Fatalf("broker TLS URL %q: %v", b.ServiceURLTLS, err)
	}
	return files, b, addr
}
