package main

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/rebatchproxy/rebatchproxy/rebatch"
	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// policyKeys are the keys of one entry of the policies list, with their help.
var policyKeys = map[string]string{
	"topics":            "topic pattern [domain://]tenant/namespace/topic, '*' globs within a segment (required)",
	"policy":            "passthrough, coalesce, properties or buckets (required)",
	"max_messages":      "messages per entry (default 1000)",
	"max_bytes":         "uncompressed bytes per entry, KiB/MiB suffixes (default 128KiB; capped by the broker's max_message_size)",
	"max_delay":         "longest a message waits in an open batch, Go duration (default 2ms)",
	"compression":       "none, lz4, zlib, zstd or snappy for built entries (default: the first client send's codec)",
	"restricted":        "properties policy: map of property key to allowed values ([] admits any value)",
	"hold_when_idle":    "keep a batch open for max_delay even when nothing of its lane is in flight (default false: send at once when idle, batch while busy)",
	"merge_producers":   "coalesce policy: merge all producers of a topic on a client connection into shared entries (at-least-once after a proxy crash; see README)",
	"buckets":           "buckets policy: number of equal-width buckets over the 16-bit hashB ring (one broker producer each)",
	"bucket_starts":     "buckets policy: explicit bucket start hashes instead, first 0, strictly increasing",
	"split_keys":        "entries never mix messages the broker's Key_Shared dispatch would route apart, so each key reaches one consumer as directly (default true for coalesce and properties, false for buckets; false merges across keys: fewer entries, keys split across Key_Shared consumers)",
	"manage_key_shared": "buckets policy: the proxy assigns whole buckets to the Key_Shared consumers that did not align themselves (AUTO_SPLIT, or STICKY without ranges), rewriting their SUBSCRIBE to STICKY ranges and rebalancing as they come and go (default true; one proxy instance per managed subscription, see README)",
	"max_pending_sends": "sends of one client producer awaiting receipts; reading from the client pauses at 3/4 of it and resumes below 1/2 (default 100000)",
}

// policiesHelp documents the policies section for --help.
func policiesHelp() string {
	keys := make([]string, 0, len(policyKeys))
	for k := range policyKeys {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("\nPer-topic policies (config file only): a list under 'policies'; the first\nrule whose pattern matches a producer's topic gives its policy, unmatched\ntopics are passthrough. SIGHUP re-reads them; new producers get the new ones.\n\n")
	b.WriteString("  policies:\n    - topics: public/default/orders-*\n      policy: coalesce\n      max_delay: 5ms\n    - topics: public/filtered/*\n      policy: properties\n      restricted: {region: [us, eu], version: ['1', '2']}\n    - topics: public/keyed/*\n      policy: buckets\n      buckets: 4\n\nKeys of a rule:\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-17s %s\n", k, policyKeys[k])
	}
	return b.String()
}

// parsePolicies turns the YAML policies section into a topic matcher. Errors
// name the rule, the key and the line.
func parsePolicies(v *yaml.Node) (*route.Matcher[rebatch.Policy], error) {
	if v == nil || (v.Kind == yaml.ScalarNode && (v.Tag == "!!null" || v.Value == "")) {
		return route.NewMatcher[rebatch.Policy](nil)
	}
	if v.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("line %d: expected a list of rules", v.Line)
	}
	var rules []route.Rule[rebatch.Policy]
	for i, item := range v.Content {
		r, err := parseRule(item)
		if err != nil {
			return nil, fmt.Errorf("policies[%d]: %w", i, err)
		}
		rules = append(rules, r)
	}
	m, err := route.NewMatcher(rules)
	if err != nil {
		var re *route.RuleError
		if errors.As(err, &re) {
			return nil, fmt.Errorf("policies[%d].topics (line %d): %q: %s", re.Index, v.Content[re.Index].Line, re.Pattern, re.Problem)
		}
		return nil, err
	}
	return m, nil
}

func parseRule(n *yaml.Node) (route.Rule[rebatch.Policy], error) {
	var r route.Rule[rebatch.Policy]
	if n.Kind != yaml.MappingNode {
		return r, fmt.Errorf("line %d: a rule is a mapping with keys topics, policy and optional limits", n.Line)
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := k.Value
		if _, ok := policyKeys[key]; !ok {
			return r, fmt.Errorf("line %d: unknown key %q (known: topics, policy, max_messages, max_bytes, max_delay, compression, restricted, merge_producers, hold_when_idle, split_keys, manage_key_shared, buckets, bucket_starts, max_pending_sends)", k.Line, key)
		}
		if seen[key] {
			return r, fmt.Errorf("line %d: key %q given twice", k.Line, key)
		}
		seen[key] = true
		bad := func(format string, a ...any) error {
			return fmt.Errorf("%s (line %d): %s", key, v.Line, fmt.Sprintf(format, a...))
		}
		s := v.Value
		if key != "restricted" && key != "bucket_starts" && v.Kind != yaml.ScalarNode {
			return r, bad("expected a single value")
		}
		switch key {
		case "topics":
			r.Pattern = s
		case "policy":
			r.Policy.Kind = rebatch.Kind(s)
		case "max_messages":
			n, err := strconv.Atoi(s)
			if err != nil || n <= 0 {
				return r, bad("%q is not a positive integer", s)
			}
			r.Policy.MaxMessages = n
		case "max_bytes":
			var b byteSize
			if err := b.Set(s); err != nil || b <= 0 {
				return r, bad("%q is not a positive size", s)
			}
			r.Policy.MaxBytes = int(b)
		case "max_delay":
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 {
				return r, bad("%q is not a positive duration", s)
			}
			r.Policy.MaxDelay = d
		case "compression":
			c, ok := pulsarpb.CompressionType_value[strings.ToUpper(s)]
			if !ok {
				return r, bad("%q: want none, lz4, zlib, zstd or snappy", s)
			}
			ct := pulsarpb.CompressionType(c)
			r.Policy.Compression = &ct
		case "merge_producers", "hold_when_idle", "split_keys", "manage_key_shared":
			b, err := strconv.ParseBool(s)
			if err != nil {
				return r, bad("%q is not true or false", s)
			}
			switch key {
			case "merge_producers":
				r.Policy.MergeProducers = b
			case "hold_when_idle":
				r.Policy.HoldWhenIdle = b
			case "manage_key_shared":
				r.Policy.ManageKeyShared = &b
			default:
				r.Policy.SplitKeys = &b
			}
		case "buckets", "max_pending_sends":
			n, err := strconv.Atoi(s)
			if err != nil || n <= 0 {
				return r, bad("%q is not a positive integer", s)
			}
			if key == "buckets" {
				r.Policy.Buckets = n
			} else {
				r.Policy.MaxPendingSends = n
			}
		case "bucket_starts":
			if err := v.Decode(&r.Policy.BucketStarts); err != nil || v.Kind != yaml.SequenceNode {
				return r, bad("expected a list of integers")
			}
		case "restricted":
			if v.Kind != yaml.MappingNode {
				return r, bad("expected a mapping of property key to a list of allowed values")
			}
			r.Policy.Restricted = map[string][]string{}
			for j := 0; j+1 < len(v.Content); j += 2 {
				pk, pv := v.Content[j], v.Content[j+1]
				var vals []string
				if err := pv.Decode(&vals); err != nil {
					return r, fmt.Errorf("restricted.%s (line %d): expected a list of values", pk.Value, pv.Line)
				}
				r.Policy.Restricted[pk.Value] = vals
			}
		}
	}
	if r.Pattern == "" {
		return r, fmt.Errorf("line %d: key \"topics\" is required", n.Line)
	}
	if r.Policy.Kind == "" {
		return r, fmt.Errorf("line %d: key \"policy\" is required", n.Line)
	}
	if err := r.Policy.Validate(); err != nil {
		return r, fmt.Errorf("line %d: %w", n.Line, err)
	}
	return r, nil
}

// loadPolicies reads the policies section of a config file.
func loadPolicies(data []byte) (*route.Matcher[rebatch.Policy], error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return parsePolicies(nil)
	}
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "policies" {
			return parsePolicies(root.Content[i+1])
		}
	}
	return parsePolicies(nil)
}
