package main

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
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

// ruleYAML is one rule of the policies section as written. Its yaml tags are the rule's keys;
// parseRule refuses any other (TestPolicyKeysDocumented keeps policyKeys, the help, in step).
type ruleYAML struct {
	Topics          string              `yaml:"topics"`
	Policy          string              `yaml:"policy"`
	MaxMessages     *positiveInt        `yaml:"max_messages"`
	MaxBytes        *byteSize           `yaml:"max_bytes"`
	MaxDelay        *positiveDuration   `yaml:"max_delay"`
	Compression     *compressionName    `yaml:"compression"`
	Restricted      map[string][]string `yaml:"restricted"`
	MergeProducers  bool                `yaml:"merge_producers"`
	HoldWhenIdle    bool                `yaml:"hold_when_idle"`
	SplitKeys       *bool               `yaml:"split_keys"`
	ManageKeyShared *bool               `yaml:"manage_key_shared"`
	Buckets         *positiveInt        `yaml:"buckets"`
	BucketStarts    []int               `yaml:"bucket_starts"`
	MaxPendingSends *positiveInt        `yaml:"max_pending_sends"`
}

// ruleKeys returns the yaml keys of ruleYAML, in declaration order.
func ruleKeys() []string {
	t := reflect.TypeOf(ruleYAML{})
	keys := make([]string, t.NumField())
	for i := range keys {
		keys[i] = t.Field(i).Tag.Get("yaml")
	}
	return keys
}

// positiveInt, positiveDuration and compressionName decode a rule's values, refusing what
// the proxy would not accept with the key's line.
type (
	positiveInt      int
	positiveDuration time.Duration
	compressionName  pulsarpb.CompressionType
)

func (p *positiveInt) UnmarshalYAML(v *yaml.Node) error {
	n, err := strconv.Atoi(v.Value)
	if v.Kind != yaml.ScalarNode || err != nil || n <= 0 {
		return fmt.Errorf("%q is not a positive integer", v.Value)
	}
	*p = positiveInt(n)
	return nil
}

func (d *positiveDuration) UnmarshalYAML(v *yaml.Node) error {
	x, err := time.ParseDuration(v.Value)
	if v.Kind != yaml.ScalarNode || err != nil || x <= 0 {
		return fmt.Errorf("%q is not a positive duration", v.Value)
	}
	*d = positiveDuration(x)
	return nil
}

func (c *compressionName) UnmarshalYAML(v *yaml.Node) error {
	x, ok := pulsarpb.CompressionType_value[strings.ToUpper(v.Value)]
	if v.Kind != yaml.ScalarNode || !ok {
		return fmt.Errorf("%q: want none, lz4, zlib, zstd or snappy", v.Value)
	}
	*c = compressionName(x)
	return nil
}

// UnmarshalYAML implements yaml.Unmarshaler for sizes in config files.
func (b *byteSize) UnmarshalYAML(v *yaml.Node) error {
	if v.Kind != yaml.ScalarNode || b.Set(v.Value) != nil || *b <= 0 {
		return fmt.Errorf("%q is not a positive size", v.Value)
	}
	return nil
}

// parseRule decodes one rule into ruleYAML: keys checked against its tags first (yaml.v3's
// Node.Decode has no KnownFields), then each value decoded by its type, so errors name the key
// and its line.
func parseRule(n *yaml.Node) (route.Rule[rebatch.Policy], error) {
	var r route.Rule[rebatch.Policy]
	if n.Kind != yaml.MappingNode {
		return r, fmt.Errorf("line %d: a rule is a mapping with keys topics, policy and optional limits", n.Line)
	}
	known := ruleKeys()
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !slices.Contains(known, k.Value) {
			return r, fmt.Errorf("line %d: unknown key %q (known: %s)", k.Line, k.Value, strings.Join(known, ", "))
		}
		if seen[k.Value] {
			return r, fmt.Errorf("line %d: key %q given twice", k.Line, k.Value)
		}
		seen[k.Value] = true
		// Decode each key alone, so a bad value is reported with its key and line.
		one := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{k, v}}
		var probe ruleYAML
		if err := one.Decode(&probe); err != nil {
			return r, fmt.Errorf("%s (line %d): %s", k.Value, v.Line, yamlProblem(err))
		}
	}
	var y ruleYAML
	if err := n.Decode(&y); err != nil {
		return r, fmt.Errorf("line %d: %s", n.Line, yamlProblem(err))
	}
	if y.Topics == "" {
		return r, fmt.Errorf("line %d: key \"topics\" is required", n.Line)
	}
	if y.Policy == "" {
		return r, fmt.Errorf("line %d: key \"policy\" is required", n.Line)
	}
	r.Pattern = y.Topics
	r.Policy = rebatch.Policy{Kind: rebatch.Kind(y.Policy), Restricted: y.Restricted, MergeProducers: y.MergeProducers,
		HoldWhenIdle: y.HoldWhenIdle, SplitKeys: y.SplitKeys, ManageKeyShared: y.ManageKeyShared, BucketStarts: y.BucketStarts}
	if y.MaxMessages != nil {
		r.Policy.MaxMessages = int(*y.MaxMessages)
	}
	if y.MaxBytes != nil {
		r.Policy.MaxBytes = int(*y.MaxBytes)
	}
	if y.MaxDelay != nil {
		r.Policy.MaxDelay = time.Duration(*y.MaxDelay)
	}
	if y.Compression != nil {
		c := pulsarpb.CompressionType(*y.Compression)
		r.Policy.Compression = &c
	}
	if y.Buckets != nil {
		r.Policy.Buckets = int(*y.Buckets)
	}
	if y.MaxPendingSends != nil {
		r.Policy.MaxPendingSends = int(*y.MaxPendingSends)
	}
	if err := r.Policy.Validate(); err != nil {
		return r, fmt.Errorf("line %d: %w", n.Line, err)
	}
	return r, nil
}

// yamlProblem shortens a yaml.v3 decode error to its message.
func yamlProblem(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg := te.Errors[0]
		if _, rest, ok := strings.Cut(msg, ": "); ok && strings.HasPrefix(msg, "line ") {
			msg = rest
		}
		return msg
	}
	return err.Error()
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
