package harness

import (
	"os"
	"path/filepath"
	"testing"
)

// Given broker logs in a cache directory,
// when StartBroker asks whether a failed start lost a port,
// then only the log of a broker that could not bind says so.
func TestPortTakenReadsTheInstanceLog(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("PULSAR_CACHE_DIR", cache)
	for inst, log := range map[string]string{
		"clash": "ERROR PulsarService - Failed to start Pulsar service: Failed to bind Pulsar broker on /127.0.0.1:34945\nCaused by: io.netty.channel.unix.Errors$NativeIoException: bind(..) failed: Address already in use\n",
		"other": "ERROR PulsarService - Failed to start Pulsar service: metadata store unavailable\n",
	} {
		dir := filepath.Join(cache, "run", inst, "logs")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "standalone.out"), []byte(log), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	clash, other, missing := portTaken("clash"), portTaken("other"), portTaken("never-started")

	if !clash || other || missing {
		t.Fatalf("clash %v, other %v, missing %v; want true, false, false", clash, other, missing)
	}
}
