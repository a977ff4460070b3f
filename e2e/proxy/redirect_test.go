package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/proxy"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// A standalone broker never redirects a lookup by itself. A real cluster redirect comes from
// two standalone brokers, A (the shared one) and B (private), with this configuration on A
// (checked against Apache Pulsar 4.0.8; TopicLookupBase.lookupTopicAsync answers
// Redirect(authoritative) to a peer cluster's brokerServiceUrl when the topic's namespace
// neither replicates to nor allows A's own cluster):
//
//   - cluster "<other>" with brokerServiceUrl = B (PUT /admin/v2/clusters/<other>);
//   - A's cluster "standalone" has <other> as a peer (POST /admin/v2/clusters/standalone/peers);
//   - a tenant allowing [standalone, <other>], and a namespace created with
//     replication_clusters [<other>]; its allowed_clusters, which creation fills with
//     [standalone], set to [<other>] (POST .../allowedClusters): without that, A serves the
//     topic itself;
//   - B has the same tenant and namespace, local to its own cluster.
//
// A second peer cluster "<loop>" naming A itself makes A redirect to itself forever.
type redirectSetup struct {
	movedNS   string // namespace A redirects to B
	loopNS    string // namespace A redirects to A
	bURL      string // B's service URL as A names it
	aURL      string
	otherName string
}

func TestLookupRedirectsFollowedByProxy(t *testing.T) {
	a := harness.Default(t)
	b, err := harness.StartBroker(harness.Options{})
	if err != nil {
		t.Fatalf("starting broker B: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Stop(); err != nil {
			t.Errorf("stopping broker B: %v", err)
		}
	})
	rs := setUpRedirects(t, a, b)
	requireRedirect(t, a.ServiceURL, "persistent://"+rs.movedNS+"/precondition", rs.bURL)
	requireRedirect(t, a.ServiceURL, "persistent://"+rs.loopNS+"/precondition", rs.aURL)

	logs := &harness.LogBuffer{}
	px, err := harness.StartProxy(a.ServiceURL, func(c *proxy.Config) {
		c.Logger = slogTo(logs)
		c.LookupTimeout = 10 * time.Second
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)

	// Given a proxy in front of broker A, and a topic whose namespace A redirects to B,
	// when a raw client sends CONNECT and LOOKUP for it through the proxy,
	// then it gets exactly one LOOKUP_RESPONSE: Connect, with its request id,
	// proxy_through_service_url=true and B's URL.
	t.Run("raw lookup", func(t *testing.T) {
		c := dialT(t, px.Addr)
		_, _ = c.Write(rawConnect(t, "", ""))
		if cmd := readCommand(t, c); cmd.GetType() != pulsarpb.BaseCommand_CONNECTED {
			t.Fatalf("got %v", cmd)
		}

		_, _ = c.Write(rawLookup(t, "persistent://"+rs.movedNS+"/raw", 42))

		r := readCommand(t, c).GetLookupTopicResponse()
		if r.GetResponse() != pulsarpb.CommandLookupTopicResponse_Connect || r.GetRequestId() != 42 ||
			!r.GetProxyThroughServiceUrl() || r.GetBrokerServiceUrl() != rs.bURL {
			t.Fatalf("got %v, want Connect to %s through the proxy", r, rs.bURL)
		}
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if n, err := c.Read(make([]byte, 1)); n > 0 || !isTimeout(err) {
			t.Fatalf("more after the answer: %d bytes, %v", n, err)
		}
		logs.WaitFor(t, "lookup redirect followed")
	})

	// Given the proxy and a topic A redirects to B,
	// when a pulsar-client-go client whose service URL is the proxy produces 100 messages
	// and consumes them,
	// then every message comes back once, and B stored all 100.
	t.Run("go client", func(t *testing.T) {
		topic := fmt.Sprintf("persistent://%s/go-%d", rs.movedNS, time.Now().UnixNano())
		followed := lookupCount(t, px.Server, "redirect_followed")
		c := newClient(t, px.URL, nil)
		cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
		if err != nil {
			t.Fatal(err)
		}
		defer cons.Close()
		p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, BatchingMaxPublishDelay: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		const n = 100

		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			p.SendAsync(ctxT(t, 30*time.Second), &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("m%03d", i))},
				func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) { errs <- err })
		}
		for i := 0; i < n; i++ {
			if err := <-errs; err != nil {
				t.Fatalf("send: %v", err)
			}
		}

		seen := map[string]bool{}
		for _, m := range receiveN(t, n, cons) {
			seen[string(m.Payload())] = true
		}
		if len(seen) != n {
			t.Fatalf("%d distinct payloads, want %d", len(seen), n)
		}
		entries, err := b.StoredEntries(ctxT(t, 30*time.Second), topic)
		if err != nil {
			t.Fatalf("reading the topic on B: %v", err)
		}
		stored := 0
		for _, e := range entries {
			stored += e.NumMessages
		}
		if stored != n {
			t.Fatalf("B stored %d messages in %d entries, want %d", stored, len(entries), n)
		}
		if got := lookupCount(t, px.Server, "redirect_followed") - followed; got < 2 {
			t.Fatalf("redirect_followed grew by %v, want at least 2 (consumer and producer lookups)", got)
		}
	})

	// Given the proxy and a topic whose namespace A redirects to A itself,
	// when a raw client looks it up through the proxy,
	// then it gets Failed(ServiceNotReady) within the lookup timeout, and redirect_failed grows by one.
	t.Run("redirect loop", func(t *testing.T) {
		failed := lookupCount(t, px.Server, "redirect_failed")
		c := dialT(t, px.Addr)
		_, _ = c.Write(rawConnect(t, "", ""))
		readCommand(t, c)
		start := time.Now()

		_, _ = c.Write(rawLookup(t, "persistent://"+rs.loopNS+"/loop", 43))

		r := readCommand(t, c).GetLookupTopicResponse()
		took := time.Since(start)
		if r.GetResponse() != pulsarpb.CommandLookupTopicResponse_Failed || r.GetError() != pulsarpb.ServerError_ServiceNotReady ||
			r.GetRequestId() != 43 || !strings.Contains(r.GetMessage(), "more than 20 redirects") {
			t.Fatalf("got %v", r)
		}
		if took > 10*time.Second {
			t.Fatalf("answered after %v", took)
		}
		if got := lookupCount(t, px.Server, "redirect_failed") - failed; got != 1 {
			t.Fatalf("redirect_failed grew by %v", got)
		}
		t.Logf("20 redirects followed and refused in %v", took.Round(time.Millisecond))
	})
}

// setUpRedirects configures A and B as described above under unique names and restores A's
// cluster configuration when the test ends.
func setUpRedirects(t *testing.T, a, b *harness.Broker) redirectSetup {
	t.Helper()
	ctx := ctxT(t, 2*time.Minute)
	sfx := strconv.FormatInt(time.Now().UnixNano(), 36)
	rs := redirectSetup{aURL: a.ServiceURL, bURL: b.ServiceURL, otherName: "rd-other-" + sfx}
	loopName, tenant := "rd-loop-"+sfx, "rd-"+sfx
	rs.movedNS, rs.loopNS = tenant+"/moved", tenant+"/loop"
	must := func(br *harness.Broker, method, path string, v any) []byte {
		t.Helper()
		out, err := br.Admin(ctx, method, path, v)
		if err != nil {
			t.Fatalf("setting up redirects: %v", err)
		}
		return out
	}

	// B: the namespace lives there.
	must(b, http.MethodPut, "/admin/v2/tenants/"+tenant, map[string]any{"allowedClusters": []string{"standalone"}})
	must(b, http.MethodPut, "/admin/v2/namespaces/"+rs.movedNS, nil)

	// A: two peer clusters, B and A itself.
	var peers []string
	if out := must(a, http.MethodGet, "/admin/v2/clusters/standalone/peers", nil); len(strings.TrimSpace(string(out))) > 0 {
		if err := json.Unmarshal(out, &peers); err != nil {
			t.Fatalf("peers of standalone: %q: %v", out, err)
		}
	}
	must(a, http.MethodPut, "/admin/v2/clusters/"+rs.otherName, map[string]string{"serviceUrl": b.AdminURL, "brokerServiceUrl": b.ServiceURL})
	must(a, http.MethodPut, "/admin/v2/clusters/"+loopName, map[string]string{"serviceUrl": a.AdminURL, "brokerServiceUrl": a.ServiceURL})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		restore := append([]string{}, peers...)
		if _, err := a.Admin(ctx, http.MethodPost, "/admin/v2/clusters/standalone/peers", restore); err != nil {
			t.Errorf("restoring the peer clusters of standalone on A: %v", err)
		}
		// Best effort: a namespace replicated elsewhere is deleted only once it is local again.
		for _, nc := range [][2]string{{rs.movedNS, rs.otherName}, {rs.loopNS, loopName}} {
			for _, step := range []struct {
				method, path string
				v            any
			}{
				{http.MethodPost, "/admin/v2/namespaces/" + nc[0] + "/allowedClusters", []string{"standalone", nc[1]}},
				{http.MethodPost, "/admin/v2/namespaces/" + nc[0] + "/replication", []string{"standalone"}},
				{http.MethodPost, "/admin/v2/namespaces/" + nc[0] + "/allowedClusters", []string{"standalone"}},
				{http.MethodDelete, "/admin/v2/namespaces/" + nc[0], nil},
			} {
				if _, err := a.Admin(ctx, step.method, step.path, step.v); err != nil {
					t.Logf("cleanup on A: %v", err)
					break
				}
			}
		}
		for _, p := range []string{"/admin/v2/tenants/" + tenant, "/admin/v2/clusters/" + rs.otherName, "/admin/v2/clusters/" + loopName} {
			if _, err := a.Admin(ctx, http.MethodDelete, p, nil); err != nil {
				t.Logf("cleanup on A: %v", err)
			}
		}
	})
	must(a, http.MethodPost, "/admin/v2/clusters/standalone/peers", append(append([]string{}, peers...), rs.otherName, loopName))
	must(a, http.MethodPut, "/admin/v2/tenants/"+tenant, map[string]any{"allowedClusters": []string{"standalone", rs.otherName, loopName}})
	for _, nc := range [][2]string{{rs.movedNS, rs.otherName}, {rs.loopNS, loopName}} {
		must(a, http.MethodPut, "/admin/v2/namespaces/"+nc[0], map[string]any{"replication_clusters": []string{nc[1]}})
		must(a, http.MethodPost, "/admin/v2/namespaces/"+nc[0]+"/allowedClusters", []string{nc[1]})
	}
	return rs
}

// requireRedirect asserts, without the proxy, that the broker at serviceURL answers a LOOKUP
// for topic with Redirect(authoritative) to want. Policy changes reach the broker's cache
// asynchronously, so it asks for up to 15 s before failing.
func requireRedirect(t *testing.T, serviceURL, topic, want string) {
	t.Helper()
	addr, err := proxy.BrokerAddress(serviceURL)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		c := dialT(t, addr)
		_, _ = c.Write(rawConnect(t, "", ""))
		readCommand(t, c)
		_, _ = c.Write(rawLookup(t, topic, 1))
		r := readCommand(t, c).GetLookupTopicResponse()
		c.Close()
		if r.GetResponse() == pulsarpb.CommandLookupTopicResponse_Redirect && r.GetBrokerServiceUrl() == want && r.GetAuthoritative() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("precondition: broker %s does not redirect %s to %s; it answered %v", serviceURL, topic, want, r)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func rawLookup(t *testing.T, topic string, id uint64) []byte {
	return rawFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_LOOKUP.Enum(),
		LookupTopic: &pulsarpb.CommandLookupTopic{Topic: proto.String(topic), RequestId: proto.Uint64(id)}})
}

func dialT(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func slogTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// lookupCount reads rebatchproxy_lookups_total{result=...} from the proxy's collector.
func lookupCount(t *testing.T, srv *proxy.Server, result string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(srv.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "rebatchproxy_lookups_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no rebatchproxy_lookups_total{result=%q}", result)
	return 0
}
