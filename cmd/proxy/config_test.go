package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Given a config file and command-line flags setting the same key,
// when the arguments are parsed,
// then the flag wins and the file's other keys apply.
func TestFlagsOverrideFile(t *testing.T) {
	p := writeConfig(t, "listen: 0.0.0.0:7000\nbroker-url: [pulsar://a:6650, pulsar://b:6651]\nidle-timeout: 2m\nhard-buffer-limit: 128MiB\npolicies: []\n")

	o, err := parseArgs([]string{"--config", p, "--listen", "127.0.0.1:7001"})

	if err != nil {
		t.Fatal(err)
	}
	cfg, err := o.proxyConfig()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:7001" || cfg.IdleTimeout != 2*time.Minute || cfg.HardBufferLimit != 128<<20 ||
		strings.Join(cfg.Brokers, ",") != "a:6650,b:6651" {
		t.Fatalf("got %+v", cfg)
	}
}

// Given bad config files,
// when they are parsed,
// then start-up fails with a message naming the offending key.
func TestBadConfigNamesKey(t *testing.T) {
	cases := []struct{ body, want string }{
		{"lissten: x\n", `unknown key "lissten"`},
		{"connect-timeout: soon\n", `key "connect-timeout"`},
		{"hard-buffer-limit: lots\n", `key "hard-buffer-limit"`},
		{"policies:\n  - match: a/b/*\n    policy: coalesce\n", `key "policies"`},
		{"listen: [a, b]\n", `key "listen"`},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			p := writeConfig(t, tc.body)

			_, err := parseArgs([]string{"--config", p})

			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v does not contain %q", err, tc.want)
			}
		})
	}
}

// Given options without a broker URL,
// when they are turned into a proxy config,
// then validation names broker-url.
func TestMissingBrokerURLNamed(t *testing.T) {
	o, err := parseArgs(nil)
	if err != nil {
		t.Fatal(err)
	}

	_, err = o.proxyConfig()

	if err == nil || !strings.HasPrefix(err.Error(), "broker-url:") {
		t.Fatalf("got %v", err)
	}
}

// Given a config file setting the lookup-redirect options,
// when it is parsed,
// then the proxy config carries them, and a negative max-lookup-redirects is refused naming the key.
func TestLookupRedirectOptions(t *testing.T) {
	good := writeConfig(t, "broker-url: pulsar://a:6650\nmax-lookup-redirects: 5\nlookup-timeout: 3s\n")
	bad := writeConfig(t, "broker-url: pulsar://a:6650\nmax-lookup-redirects: -1\n")

	og, errGood := parseArgs([]string{"--config", good})
	ob, errBad := parseArgs([]string{"--config", bad})

	if errGood != nil || errBad != nil {
		t.Fatal(errGood, errBad)
	}
	cfg, err := og.proxyConfig()
	if err != nil || cfg.MaxLookupRedirects != 5 || cfg.LookupTimeout != 3*time.Second {
		t.Fatalf("got %v, %+v", err, cfg)
	}
	if _, err := ob.proxyConfig(); err == nil || !strings.HasPrefix(err.Error(), "max-lookup-redirects:") {
		t.Fatalf("got %v", err)
	}
}

// Given a config file setting max-connection-lookups, and one setting it to 0,
// when they are parsed,
// then the proxy config carries the bound, and 0 is refused naming the key.
func TestConnectionLookupBoundOption(t *testing.T) {
	good := writeConfig(t, "broker-url: pulsar://a:6650\nmax-connection-lookups: 8\n")
	bad := writeConfig(t, "broker-url: pulsar://a:6650\nmax-connection-lookups: 0\n")

	og, errGood := parseArgs([]string{"--config", good})
	ob, errBad := parseArgs([]string{"--config", bad})

	if errGood != nil || errBad != nil {
		t.Fatal(errGood, errBad)
	}
	if cfg, err := og.proxyConfig(); err != nil || cfg.MaxConnectionLookups != 8 {
		t.Fatalf("got %v, %+v", err, cfg)
	}
	if _, err := ob.proxyConfig(); err == nil || !strings.HasPrefix(err.Error(), "max-connection-lookups:") {
		t.Fatalf("got %v", err)
	}
}
