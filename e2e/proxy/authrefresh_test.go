package proxy_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/proxy"
)

// TestAuthRefreshThroughProxy shows that the broker's credential refresh works through the
// proxy: the broker's AUTH_CHALLENGE on an established connection reaches the client and the
// client's AUTH_RESPONSE reaches the broker, which decides.
//
// Apache Pulsar 4.0.8 (ServerCnx.refreshAuthenticationCredentials) checks every connection
// each authenticationRefreshCheckSeconds; when the token it authenticated has passed its exp
// claim it sends AUTH_CHALLENGE to a client that advertised supports_auth_refresh (closing any
// other), and closes the connection if the previous challenge is still unanswered at the next
// check. An AUTH_RESPONSE is authenticated like a CONNECT's data: a valid token keeps the
// connection, an expired one gets ERROR(AuthenticationError) and the connection is closed.
// pulsar-client-go advertises the flag and answers a challenge with a fresh call of its token
// supplier.
func TestAuthRefreshThroughProxy(t *testing.T) {
	b, err := harness.StartBroker(harness.Options{TokenAuth: true, AuthRefreshSeconds: 1})
	if err != nil {
		t.Fatalf("starting a token-auth broker: %v", err)
	}
	defer b.Stop()

	t.Run("fresh token in AUTH_RESPONSE keeps the connection", func(t *testing.T) {
		// Given a client through the proxy whose token supplier returns a token expiring in
		// about 5 s until that expiry has passed and fresh one-hour tokens afterwards, and a
		// consumer and a producer on one topic, set up before the first token expires
		px, logs := startAuthProxy(t, b)
		sup := newTokenSupplier(t, b, true)
		c := newClient(t, px.URL, pulsar.NewAuthenticationTokenFromSupplier(sup.get))
		topic := uniqueTopic("authrefresh")
		cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
		if err != nil {
			t.Fatal(err)
		}
		defer cons.Close()
		p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if time.Now().After(sup.shortExp.Add(-time.Second)) {
			t.Fatalf("setup ended %v before the first token's expiry; too slow to show a refresh",
				time.Until(sup.shortExp))
		}
		connsBefore := proxyCounter(t, px.Server, "rebatchproxy_connections_total", "side", "client")

		// When the producer sends a message every 200 ms for 10 s while the consumer receives
		const n = 50
		start := time.Now()
		got := make(map[string]int)
		var mu sync.Mutex
		recvDone := make(chan struct{})
		go func() {
			defer close(recvDone)
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			for total := 0; total < n; total++ {
				m, err := cons.Receive(ctx)
				if err != nil {
					return
				}
				_ = cons.Ack(m)
				mu.Lock()
				got[string(m.Payload())]++
				mu.Unlock()
			}
		}()
		for i := range n {
			if _, err := p.Send(ctxT(t, 10*time.Second), &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("m-%02d", i))}); err != nil {
				t.Errorf("send %d at %v: %v", i, time.Since(start).Round(time.Millisecond), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		<-recvDone
		elapsed := time.Since(start)

		// Then every message arrives exactly once, the broker's challenges reached the client
		// and were each answered with a fresh token that reached the broker, and no connection
		// closed or was reopened
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if m, err := cons.Receive(rctx); err == nil {
			t.Errorf("extra message %q after all %d", m.Payload(), n)
		}
		cancel()
		mu.Lock()
		for i := range n {
			if k := fmt.Sprintf("m-%02d", i); got[k] != 1 {
				t.Errorf("%s received %d times, want 1", k, got[k])
			}
		}
		mu.Unlock()
		challenges := proxyCounter(t, px.Server, "rebatchproxy_frames_total", "direction", "broker_to_client", "command", "AUTH_CHALLENGE")
		responses := proxyCounter(t, px.Server, "rebatchproxy_frames_total", "direction", "client_to_broker", "command", "AUTH_RESPONSE")
		t.Logf("in %v: %v AUTH_CHALLENGE broker->client, %v AUTH_RESPONSE client->broker on %v client connections; supplier: %d short-lived, %d fresh tokens",
			elapsed.Round(time.Millisecond), challenges, responses, connsBefore, sup.shortCalls.Load(), sup.freshCalls.Load())
		if challenges < 1 {
			t.Errorf("no AUTH_CHALLENGE relayed to the client: the broker never challenged, nothing was shown")
		}
		if responses < 1 || responses != challenges {
			t.Errorf("%v AUTH_RESPONSE relayed to the broker for %v challenges, want one each", responses, challenges)
		}
		if f := sup.freshCalls.Load(); f < 1 {
			t.Errorf("the supplier never handed out a fresh token")
		}
		if after := proxyCounter(t, px.Server, "rebatchproxy_connections_total", "side", "client"); after != connsBefore {
			t.Errorf("client connections opened: %v before, %v after; the client reconnected", connsBefore, after)
		}
		if closes := proxyCounter(t, px.Server, "rebatchproxy_closes_total"); closes != 0 {
			t.Errorf("%v connection pairs closed during the refresh, want 0", closes)
		}
		if strings.Contains(logs.String(), `msg="connection closed"`) {
			t.Errorf("proxy logged a close:\n%s", logs)
		}
	})

	t.Run("expired token in AUTH_RESPONSE: the broker closes the connection", func(t *testing.T) {
		// Given a client through the proxy whose token supplier always returns the same token,
		// expiring in about 5 s, and a producer created before it expires
		px, logs := startAuthProxy(t, b)
		sup := newTokenSupplier(t, b, false)
		c := newClient(t, px.URL, pulsar.NewAuthenticationTokenFromSupplier(sup.get))
		p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: uniqueTopic("authexpired"), DisableBatching: true})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()

		// When the producer sends a message every 200 ms, each with a 2 s deadline, until one
		// fails or 20 s have passed
		start := time.Now()
		var sendErr error
		var failedAt time.Duration
		for i := 0; time.Since(start) < 20*time.Second; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, sendErr = p.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("m-%02d", i))})
			cancel()
			if sendErr != nil {
				failedAt = time.Since(start)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}

		// Then a send failed after the token expired, the broker's challenge reached the client
		// and the expired token's AUTH_RESPONSE reached the broker, whose ERROR and close the
		// proxy relayed
		challenges := proxyCounter(t, px.Server, "rebatchproxy_frames_total", "direction", "broker_to_client", "command", "AUTH_CHALLENGE")
		responses := proxyCounter(t, px.Server, "rebatchproxy_frames_total", "direction", "client_to_broker", "command", "AUTH_RESPONSE")
		errorsRelayed := proxyCounter(t, px.Server, "rebatchproxy_frames_total", "direction", "broker_to_client", "command", "ERROR")
		brokerClosed := proxyCounter(t, px.Server, "rebatchproxy_closes_total", "reason", "broker_closed")
		t.Logf("send failed after %v (token expired after %v): %v; %v AUTH_CHALLENGE, %v AUTH_RESPONSE, %v ERROR relayed, %v closed by the broker; supplier calls %d",
			failedAt.Round(time.Millisecond), sup.shortExp.Sub(start).Round(time.Millisecond), sendErr,
			challenges, responses, errorsRelayed, brokerClosed, sup.shortCalls.Load())
		if sendErr == nil {
			t.Fatalf("every send succeeded for 20 s with an expired token")
		}
		if start.Add(failedAt).Before(sup.shortExp) {
			t.Errorf("send failed before the token expired: %v", sendErr)
		}
		if challenges < 1 {
			t.Errorf("no AUTH_CHALLENGE relayed to the client")
		}
		if responses < 1 {
			t.Errorf("no AUTH_RESPONSE relayed to the broker")
		}
		if errorsRelayed < 1 {
			t.Errorf("the broker's ERROR did not reach the client")
		}
		if brokerClosed < 1 {
			t.Errorf("no connection closed by the broker")
		}
		if !logHas(logs.String(), `msg="connection closed"`, "by=broker") {
			t.Errorf("proxy logged no close by the broker:\n%s", logs)
		}
		if f := sup.freshCalls.Load(); f != 0 {
			t.Errorf("supplier handed out %d fresh tokens in the negative control", f)
		}
	})
}

// tokenSupplier hands the Go client's NewAuthenticationTokenFromSupplier its tokens: one that
// expires about 5 s after it was made, then, if refresh is set and that expiry has passed,
// fresh tokens valid for an hour.
type tokenSupplier struct {
	b          *harness.Broker
	short      string
	shortExp   time.Time
	refresh    bool
	shortCalls atomic.Int32
	freshCalls atomic.Int32
}

func newTokenSupplier(t *testing.T, b *harness.Broker, refresh bool) *tokenSupplier {
	t.Helper()
	// The exp claim has whole seconds; the token is valid until exp, so make exp a whole second.
	exp := time.Unix(time.Now().Add(5*time.Second).Unix(), 0)
	tok, err := b.TokenExpiring("alice", exp)
	if err != nil {
		t.Fatal(err)
	}
	return &tokenSupplier{b: b, short: tok, shortExp: exp, refresh: refresh}
}

func (s *tokenSupplier) get() (string, error) {
	if !s.refresh || time.Now().Before(s.shortExp) {
		s.shortCalls.Add(1)
		return s.short, nil
	}
	s.freshCalls.Add(1)
	return s.b.TokenExpiring("alice", time.Now().Add(time.Hour))
}

// startAuthProxy runs a proxy of its own in front of b, logging at debug level (closes included).
func startAuthProxy(t *testing.T, b *harness.Broker) (*harness.InProcessProxy, *harness.LogBuffer) {
	t.Helper()
	logs := &harness.LogBuffer{}
	px, err := harness.StartProxy(b.ServiceURL, func(c *proxy.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	return px, logs
}

// proxyCounter sums the series of the proxy's metric name whose labels include every given
// name/value pair; a series the proxy never emitted (a command never seen) counts as 0, a
// metric it does not have fails the test.
func proxyCounter(t *testing.T, srv *proxy.Server, name string, labels ...string) float64 {
	t.Helper()
	sum, seen := harness.MetricSum(t, []prometheus.Collector{srv.Collector()}, name, labels...)
	if !seen {
		t.Fatalf("the proxy has no metric %s", name)
	}
	return sum
}

// logHas reports whether one line of log contains every part.
func logHas(log string, parts ...string) bool {
	for _, line := range strings.Split(log, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}
