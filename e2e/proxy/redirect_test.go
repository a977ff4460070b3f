package proxy_test

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/proxy"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// A standalone broker never redirects a lookup by itself: harness.SetUpRedirect configures a
// real cluster redirect on two standalone brokers, A (the shared one) and B (private), and checks
// on A directly that it redirects one namespace to B and another to A itself.
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
	rd, err := harness.SetUpRedirect(t, a, b)
	if err != nil {
		t.Fatal(err)
	}

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

		_, _ = c.Write(rawLookup(t, rd.Topic("raw"), 42))

		r := readCommand(t, c).GetLookupTopicResponse()
		if r.GetResponse() != pulsarpb.CommandLookupTopicResponse_Connect || r.GetRequestId() != 42 ||
			!r.GetProxyThroughServiceUrl() || r.GetBrokerServiceUrl() != b.ServiceURL {
			t.Fatalf("got %v, want Connect to %s through the proxy", r, b.ServiceURL)
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
		topic := rd.Topic(fmt.Sprintf("go-%d", time.Now().UnixNano()))
		followed := proxyCounter(t, px.Server, "rebatchproxy_lookups_total", "result", "redirect_followed")
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
		if got := proxyCounter(t, px.Server, "rebatchproxy_lookups_total", "result", "redirect_followed") - followed; got < 2 {
			t.Fatalf("redirect_followed grew by %v, want at least 2 (consumer and producer lookups)", got)
		}
	})

	// Given the proxy and a topic whose namespace A redirects to A itself,
	// when a raw client looks it up through the proxy,
	// then it gets Failed(ServiceNotReady) within the lookup timeout, and redirect_failed grows by one.
	t.Run("redirect loop", func(t *testing.T) {
		failed := proxyCounter(t, px.Server, "rebatchproxy_lookups_total", "result", "redirect_failed")
		c := dialT(t, px.Addr)
		_, _ = c.Write(rawConnect(t, "", ""))
		readCommand(t, c)
		start := time.Now()

		_, _ = c.Write(rawLookup(t, "persistent://"+rd.LoopNamespace+"/loop", 43))

		r := readCommand(t, c).GetLookupTopicResponse()
		took := time.Since(start)
		if r.GetResponse() != pulsarpb.CommandLookupTopicResponse_Failed || r.GetError() != pulsarpb.ServerError_ServiceNotReady ||
			r.GetRequestId() != 43 || !strings.Contains(r.GetMessage(), "more than 20 redirects") {
			t.Fatalf("got %v", r)
		}
		if took > 10*time.Second {
			t.Fatalf("answered after %v", took)
		}
		if got := proxyCounter(t, px.Server, "rebatchproxy_lookups_total", "result", "redirect_failed") - failed; got != 1 {
			t.Fatalf("redirect_failed grew by %v", got)
		}
		t.Logf("20 redirects followed and refused in %v", took.Round(time.Millisecond))
	})
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
