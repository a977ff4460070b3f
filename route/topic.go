package route

import (
	"fmt"
	"strconv"
	"strings"
)

// Topic domains as they appear before "://".
const (
	DomainPersistent    = "persistent"
	DomainNonPersistent = "non-persistent"
)

const partitionSuffix = "-partition-"

// Topic is a parsed v2 topic name. Partition is -1 for a topic that is not a
// partition; Local is then the whole local name, else the parent's.
type Topic struct {
	Domain    string
	Tenant    string
	Namespace string
	Local     string
	Partition int
}

// String returns the parent topic's full name (partition suffix removed).
func (t Topic) String() string {
	return t.Domain + "://" + t.Tenant + "/" + t.Namespace + "/" + t.Local
}

// ParseTopic parses a topic name the way Pulsar's TopicName does for v2 names:
// "domain://tenant/namespace/local", "tenant/namespace/local" (persistent), or
// a bare "local" (persistent://public/default/local). A local name ending in
// "-partition-N", N a non-negative int in canonical decimal, is partition N of
// its parent; any other text after the last "-partition-" leaves the name as it
// is, as in TopicName.getPartitionIndex. Legacy v1 names (with a cluster segment) are
// refused. Any goroutine may call it.
func ParseTopic(name string) (Topic, error) {
	t := Topic{Domain: DomainPersistent, Partition: -1}
	rest := name
	if d, r, ok := strings.Cut(name, "://"); ok {
		if d != DomainPersistent && d != DomainNonPersistent {
			return Topic{}, fmt.Errorf("route: topic %q: unknown domain %q", name, d)
		}
		t.Domain, rest = d, r
	}
	parts := strings.Split(rest, "/")
	switch {
	case len(parts) == 1 && rest == name:
		t.Tenant, t.Namespace, t.Local = "public", "default", parts[0]
	case len(parts) == 3:
		t.Tenant, t.Namespace, t.Local = parts[0], parts[1], parts[2]
	case len(parts) > 3:
		return Topic{}, fmt.Errorf("route: topic %q: v1 names with a cluster segment are not supported", name)
	default:
		return Topic{}, fmt.Errorf("route: topic %q: want tenant/namespace/topic", name)
	}
	if t.Tenant == "" || t.Namespace == "" || t.Local == "" {
		return Topic{}, fmt.Errorf("route: topic %q: empty tenant, namespace or topic", name)
	}
	if i := strings.LastIndex(t.Local, partitionSuffix); i >= 0 {
		digits := t.Local[i+len(partitionSuffix):]
		// Canonical decimal only ("01" and "+1" are not partitions), as the
		// length check in TopicName.getPartitionIndex (Pulsar 4.0.8) demands.
		if n, err := strconv.Atoi(digits); err == nil && n >= 0 && strconv.Itoa(n) == digits && i > 0 {
			t.Local, t.Partition = t.Local[:i], n
		}
	}
	return t, nil
}
