package proxy_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/internal/testcert"
	"github.com/rebatchproxy/rebatchproxy/proxy"
)

// Given the proxy's web port over HTTP and over HTTPS (certificates made now) in front of the real
// broker's web service,
// when bin/pulsar-admin from the distribution, pointed at each, creates a tenant, a namespace and a
// partitioned topic of 3 partitions, lists the namespace's partitioned topics and reads the
// topic's partitioned stats,
// then every command succeeds, the list names the topic and the stats have its 3 partitions.
func TestPulsarAdminThroughTheWebPort(t *testing.T) {
	b := harness.Default(t)
	home, err := harness.PulsarHome(ctxT(t, 5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	files, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	px, err := harness.StartProxy(b.ServiceURL, func(c *proxy.Config) {
		c.WebListen, c.WebTLSListen, c.BrokerWebURLs = "127.0.0.1:0", "127.0.0.1:0", []string{b.AdminURL}
		c.TLSCertFile, c.TLSKeyFile = files.ServerCert, files.ServerKey
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	web := px.Server.WebAddrs()
	_, tlsPort, _ := net.SplitHostPort(web[1])

	for _, scheme := range []struct {
		name string
		args []string
	}{
		{"http", []string{"--admin-url", "http://" + web[0]}},
		{"https", []string{"--admin-url", "https://localhost:" + tlsPort, "--tls-trust-cert-path", files.CA, "--tls-enable-hostname-verification"}},
	} {
		t.Run(scheme.name, func(t *testing.T) {
			tenant := fmt.Sprintf("web-%s-%d", scheme.name, time.Now().UnixNano())
			ns, topic := tenant+"/ns", "persistent://"+tenant+"/ns/t"
			admin := func(args ...string) string {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				out, err := exec.CommandContext(ctx, filepath.Join(home, "bin", "pulsar-admin"), append(scheme.args, args...)...).CombinedOutput()
				if err != nil {
					t.Fatalf("pulsar-admin %s: %v\n%s", strings.Join(args, " "), err, out)
				}
				return string(out)
			}
			admin("tenants", "create", tenant, "--allowed-clusters", "standalone")
			admin("namespaces", "create", ns)
			admin("topics", "create-partitioned-topic", topic, "-p", "3")

			list := admin("topics", "list-partitioned-topics", ns)
			stats := admin("topics", "partitioned-stats", topic, "--per-partition")

			if !strings.Contains(list, topic) {
				t.Errorf("the list does not name %s:\n%s", topic, list)
			}
			for i := 0; i < 3; i++ {
				if !strings.Contains(stats, fmt.Sprintf("%s-partition-%d", topic, i)) {
					t.Errorf("stats lack partition %d:\n%s", i, stats)
				}
			}
		})
	}
}

// Given a private broker with package management on (file-system storage) and the proxy's web
// port in front of its web service,
// when bin/pulsar-admin, pointed at the web port, uploads a 24 MiB package (over the 10 MiB the
// proxy holds to resend, so it is streamed) and downloads it again,
// then both succeed and the download is the upload, byte for byte.
func TestPulsarAdminUploadsALargePackageThroughTheWebPort(t *testing.T) {
	home, err := harness.PulsarHome(ctxT(t, 5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	b, err := harness.StartBroker(harness.Options{ExtraConf: "enablePackagesManagement=true\n" +
		"packagesManagementStorageProvider=org.apache.pulsar.packages.management.storage.filesystem.FileSystemPackagesStorageProvider\n" +
		"STORAGE_PATH=" + filepath.Join(dir, "packages")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	px, err := harness.StartProxy(b.ServiceURL, func(c *proxy.Config) {
		c.WebListen, c.BrokerWebURLs = "127.0.0.1:0", []string{b.AdminURL}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	upload := make([]byte, 24<<20)
	if _, err := rand.Read(upload); err != nil {
		t.Fatal(err)
	}
	in, out := filepath.Join(dir, "in.jar"), filepath.Join(dir, "out.jar")
	if err := os.WriteFile(in, upload, 0o600); err != nil {
		t.Fatal(err)
	}
	admin := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		args = append([]string{"--admin-url", "http://" + px.Server.WebAddrs()[0]}, args...)
		if out, err := exec.CommandContext(ctx, filepath.Join(home, "bin", "pulsar-admin"), args...).CombinedOutput(); err != nil {
			t.Fatalf("pulsar-admin %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	pkg := "function://public/default/big@v1"

	admin("packages", "upload", pkg, "--path", in, "--description", "24 MiB through the web port")

	admin("packages", "download", pkg, "--path", out)
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, upload) {
		t.Fatalf("the download is %d bytes and not the upload (%d bytes)", len(got), len(upload))
	}
}
