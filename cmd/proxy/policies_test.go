package main

import (
	"os"
	"strings"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/rebatch"
)

func TestLoadPolicies(t *testing.T) {
	good := `
policies:
  - topics: public/default/orders-*
    policy: coalesce
    max_messages: 500
    max_bytes: 64KiB
    max_delay: 5ms
    compression: lz4
    max_pending_sends: 2000
    split_keys: false
  - topics: public/filtered/*
    policy: properties
    restricted: {region: [us, eu], version: ['1', '2'], any: []}
`
	m, err := loadPolicies([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	p, idx, ok := m.Match("persistent://public/default/orders-eu-partition-2")
	if !ok || idx != 0 || p.Kind != rebatch.Coalesce || p.MaxMessages != 500 || p.MaxBytes != 64<<10 || p.MaxDelay.String() != "5ms" || p.Compression == nil || p.Compression.String() != "LZ4" || p.MaxPendingSends != 2000 || p.KeysApart() {
		t.Fatalf("orders rule: %+v %d %v", p, idx, ok)
	}
	p, _, ok = m.Match("public/filtered/x")
	if !ok || p.Kind != rebatch.Properties || len(p.Restricted["region"]) != 2 || p.Restricted["any"] == nil && len(p.Restricted["any"]) != 0 || !p.KeysApart() {
		t.Fatalf("filtered rule: %+v", p)
	}
	if _, _, ok := m.Match("public/other/x"); ok {
		t.Fatal("an unmatched topic matched")
	}

	bad := []struct{ yaml, want string }{
		{"policies:\n  - topics: a/b/*\n    policy: coalesce\n    max_mesages: 3\n", `unknown key "max_mesages"`},
		{"policies:\n  - topics: a/b/*\n    policy: bucketz\n", `kind "bucketz"`},
		{"policies:\n  - topics: a/b/*\n    policy: coalesce\n    max_delay: soon\n", `max_delay (line 4)`},
		{"policies:\n  - topics: a/b/*\n    policy: coalesce\n    compression: brotli\n", `compression (line 4)`},
		{"policies:\n  - topics: a/b/*\n    policy: properties\n", `restricted`},
		{"policies:\n  - policy: coalesce\n", `"topics" is required`},
		{"policies:\n  - topics: '*/*/*'\n    policy: coalesce\n  - topics: a/b/c\n    policy: coalesce\n", `policies[1].topics (line 4)`},
		{"policies: {a: b}\n", `expected a list`},
		{"policies:\n  - topics: a/b/*\n    policy: coalesce\n    max_pending_sends: 0\n", `max_pending_sends (line 4)`},
		{"policies:\n  - topics: a/b/*\n    policy: coalesce\n    max_bytes: lots\n", `max_bytes (line 4): "lots" is not a positive size`},
		{"policies:\n  - topics: a/b/*\n    policy: coalesce\n    split_keys: maybe\n", `split_keys (line 4)`},
		{"policies:\n  - topics: a/b/*\n    policy: buckets\n    bucket_starts: [0, x]\n", `bucket_starts (line 4)`},
		{"policies:\n  - topics: a/b/*\n    policy: coalesce\n    manage_key_shared: true\n", `manage_key_shared`},
		{"policies:\n  - topics: a/b/*\n    policy: coalesce\n    max_delay: 1ms\n    max_delay: 2ms\n", `given twice`},
	}
	for _, tc := range bad {
		_, err := loadPolicies([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config %q: error %v, want it to mention %q", tc.yaml, err, tc.want)
		}
	}
}

// The policies example in the README must stay a valid configuration.
func TestReadmePolicyExampleLoads(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "## Policies")
	if !ok {
		t.Fatal("README has no Policies section")
	}
	_, block, ok := strings.Cut(rest, "```yaml\n")
	if !ok {
		t.Fatal("README's Policies section has no yaml block")
	}
	block, _, _ = strings.Cut(block, "```")
	m, err := loadPolicies([]byte(block))
	if err != nil {
		t.Fatalf("README example: %v", err)
	}
	for topic, want := range map[string]rebatch.Kind{
		"public/default/orders-1": rebatch.Coalesce, "public/metrics/x": rebatch.Coalesce,
		"public/filtered/x": rebatch.Properties, "public/keyed/x": rebatch.Buckets,
	} {
		if p, _, ok := m.Match(topic); !ok || p.Kind != want {
			t.Errorf("%s: %v %v, want %s", topic, p.Kind, ok, want)
		}
	}
}

// Every key a rule takes is documented in --help, and nothing else is.
func TestPolicyKeysDocumented(t *testing.T) {
	keys := ruleKeys()
	if len(keys) != len(policyKeys) {
		t.Fatalf("rule keys %v, documented %d", keys, len(policyKeys))
	}
	for _, k := range keys {
		if policyKeys[k] == "" {
			t.Errorf("key %q of ruleYAML has no help in policyKeys", k)
		}
	}
}
