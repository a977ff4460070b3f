package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Redirect is a cluster configuration under which broker A answers a LOOKUP with
// Redirect(authoritative): for topics of Namespace to broker B, which owns them, and for topics
// of LoopNamespace to A itself, forever.
//
// A standalone broker never redirects a lookup by itself. SetUpRedirect configures one on two
// standalone brokers, A and B (checked against Apache Pulsar 4.0.8:
// TopicLookupBase.lookupTopicAsync answers Redirect(authoritative) to a peer cluster's
// brokerServiceUrl when the topic's namespace neither replicates to nor allows A's own cluster):
//
//   - on A, cluster Cluster with brokerServiceUrl = B (PUT /admin/v2/clusters/<name>), and a
//     cluster naming A itself;
//   - A's cluster "standalone" has both as peers (POST /admin/v2/clusters/standalone/peers);
//   - on A, a tenant allowing all three clusters, and the two namespaces created with
//     replication_clusters [<that cluster>]; their allowed_clusters, which creation fills with
//     [standalone], set to [<that cluster>] (POST .../allowedClusters): without that, A serves
//     the topic itself;
//   - on B, the same tenant and Namespace, local to B's own cluster "standalone".
type Redirect struct {
	Tenant        string
	Namespace     string // tenant/namespace whose lookups A redirects to B
	LoopNamespace string // tenant/namespace whose lookups A redirects to A itself
	Cluster       string // the cluster on A naming B
	A, B          *Broker
}

// Topic returns a topic of r.Namespace (served by B, redirected to by A) named name.
func (r Redirect) Topic(name string) string { return "persistent://" + r.Namespace + "/" + name }

// SetUpRedirect configures a and b as Redirect describes, under names unique to this call, and
// checks on a directly (a raw LOOKUP, no proxy) that it really redirects: Namespace to b's
// service URL and LoopNamespace to its own, retrying for up to 15 s while the policies reach a's
// cache. It registers on t a cleanup that removes what it added to a (the peer clusters, then,
// best effort, the namespaces, the tenant and the clusters); b is the caller's to stop.
//
// It returns an error, never fails t itself, so it may be called from any goroutine; the
// caller must fail the test on an error (the precondition does not hold).
func SetUpRedirect(t testing.TB, a, b *Broker) (Redirect, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sfx := strconv.FormatInt(time.Now().UnixNano(), 36)
	r := Redirect{Tenant: "rd-" + sfx, Cluster: "rd-other-" + sfx, A: a, B: b}
	loopCluster := "rd-loop-" + sfx
	r.Namespace, r.LoopNamespace = r.Tenant+"/moved", r.Tenant+"/loop"
	type call struct {
		br           *Broker
		method, path string
		v            any
	}
	run := func(calls ...call) error {
		for _, c := range calls {
			if _, err := c.br.Admin(ctx, c.method, c.path, c.v); err != nil {
				return fmt.Errorf("setting up a lookup redirect: %w", err)
			}
		}
		return nil
	}

	// B: the namespace lives there.
	if err := run(
		call{b, http.MethodPut, "/admin/v2/tenants/" + r.Tenant, map[string]any{"allowedClusters": []string{"standalone"}}},
		call{b, http.MethodPut, "/admin/v2/namespaces/" + r.Namespace, nil},
	); err != nil {
		return r, err
	}

	// A: two peer clusters, B and A itself.
	if err := run(
		call{a, http.MethodPut, "/admin/v2/clusters/" + r.Cluster, map[string]string{"serviceUrl": b.AdminURL, "brokerServiceUrl": b.ServiceURL}},
		call{a, http.MethodPut, "/admin/v2/clusters/" + loopCluster, map[string]string{"serviceUrl": a.AdminURL, "brokerServiceUrl": a.ServiceURL}},
	); err != nil {
		return r, err
	}
	ours := []string{r.Cluster, loopCluster}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Remove only our own peers, so that another set-up on the same broker keeps its own.
		peers, err := peerClusters(ctx, a)
		if err == nil {
			peers = slices.DeleteFunc(peers, func(p string) bool { return slices.Contains(ours, p) })
			_, err = a.Admin(ctx, http.MethodPost, "/admin/v2/clusters/standalone/peers", append([]string{}, peers...))
		}
		if err != nil {
			t.Errorf("removing the redirect's peer clusters of standalone on %s: %v", a.AdminURL, err)
		}
		// Best effort: a namespace replicated elsewhere is deleted only once it is local again.
		for _, nc := range [][2]string{{r.Namespace, r.Cluster}, {r.LoopNamespace, loopCluster}} {
			for _, c := range []call{
				{a, http.MethodPost, "/admin/v2/namespaces/" + nc[0] + "/allowedClusters", []string{"standalone", nc[1]}},
				{a, http.MethodPost, "/admin/v2/namespaces/" + nc[0] + "/replication", []string{"standalone"}},
				{a, http.MethodPost, "/admin/v2/namespaces/" + nc[0] + "/allowedClusters", []string{"standalone"}},
				{a, http.MethodDelete, "/admin/v2/namespaces/" + nc[0], nil},
			} {
				if _, err := a.Admin(ctx, c.method, c.path, c.v); err != nil {
					t.Logf("redirect cleanup on A: %v", err)
					break
				}
			}
		}
		for _, p := range []string{"/admin/v2/tenants/" + r.Tenant, "/admin/v2/clusters/" + r.Cluster, "/admin/v2/clusters/" + loopCluster} {
			if _, err := a.Admin(ctx, http.MethodDelete, p, nil); err != nil {
				t.Logf("redirect cleanup on A: %v", err)
			}
		}
	})
	peers, err := peerClusters(ctx, a)
	if err != nil {
		return r, fmt.Errorf("setting up a lookup redirect: %w", err)
	}
	calls := []call{
		{a, http.MethodPost, "/admin/v2/clusters/standalone/peers", append(peers, ours...)},
		{a, http.MethodPut, "/admin/v2/tenants/" + r.Tenant, map[string]any{"allowedClusters": []string{"standalone", r.Cluster, loopCluster}}},
	}
	for _, nc := range [][2]string{{r.Namespace, r.Cluster}, {r.LoopNamespace, loopCluster}} {
		calls = append(calls,
			call{a, http.MethodPut, "/admin/v2/namespaces/" + nc[0], map[string]any{"replication_clusters": []string{nc[1]}}},
			call{a, http.MethodPost, "/admin/v2/namespaces/" + nc[0] + "/allowedClusters", []string{nc[1]}})
	}
	if err := run(calls...); err != nil {
		return r, err
	}

	// The precondition, asked of A directly.
	for _, want := range [][2]string{{r.Namespace, b.ServiceURL}, {r.LoopNamespace, a.ServiceURL}} {
		if err := a.waitRedirect(ctx, "persistent://"+want[0]+"/precondition", want[1]); err != nil {
			return r, err
		}
	}
	return r, nil
}

// peerClusters lists the peer clusters of b's cluster "standalone".
func peerClusters(ctx context.Context, b *Broker) ([]string, error) {
	out, err := b.Admin(ctx, http.MethodGet, "/admin/v2/clusters/standalone/peers", nil)
	if err != nil {
		return nil, err
	}
	var peers []string
	if len(strings.TrimSpace(string(out))) > 0 {
		if err := json.Unmarshal(out, &peers); err != nil {
			return nil, fmt.Errorf("peers of standalone: %q: %w", out, err)
		}
	}
	return peers, nil
}

// waitRedirect returns nil once b answers a LOOKUP for topic with Redirect(authoritative) to
// want. Policy changes reach the broker's cache asynchronously, so it asks for up to 15 s.
func (b *Broker) waitRedirect(ctx context.Context, topic, want string) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		r, err := b.Lookup(ctx, topic)
		if err == nil && r.GetResponse() == pulsarpb.CommandLookupTopicResponse_Redirect &&
			r.GetBrokerServiceUrl() == want && r.GetAuthoritative() {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				return fmt.Errorf("precondition: looking up %s on %s: %w", topic, b.ServiceURL, err)
			}
			return fmt.Errorf("precondition: broker %s does not redirect %s to %s; it answered %v", b.ServiceURL, topic, want, r)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Lookup sends one LOOKUP for topic straight to b (a raw protocol connection of its own,
// authenticated with the admin token when b has one) and returns b's answer.
func (b *Broker) Lookup(ctx context.Context, topic string) (*pulsarpb.CommandLookupTopicResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rw, err := b.rawConnect(ctx)
	if err != nil {
		return nil, err
	}
	defer rw.c.Close()
	if err := rw.send(&pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_LOOKUP.Enum(), LookupTopic: &pulsarpb.CommandLookupTopic{
		Topic: proto.String(topic), RequestId: proto.Uint64(1)}}); err != nil {
		return nil, err
	}
	f, err := rw.expect(pulsarpb.BaseCommand_LOOKUP_RESPONSE)
	if err != nil {
		return nil, err
	}
	var cmd pulsarpb.BaseCommand
	if err := wire.DecodeCommand(f, &cmd); err != nil {
		return nil, err
	}
	return cmd.GetLookupTopicResponse(), nil
}
