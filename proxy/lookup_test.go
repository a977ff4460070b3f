package proxy

import (
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

const redirTopic = "persistent://t/n/redirected"

func lookupCmd(id uint64) *pulsarpb.BaseCommand {
	return &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_LOOKUP.Enum(), LookupTopic: &pulsarpb.CommandLookupTopic{
		Topic: proto.String(redirTopic), RequestId: proto.Uint64(id), AdvertisedListenerName: proto.String("internal"),
		Properties: []*pulsarpb.KeyValue{{Key: proto.String("k"), Value: proto.String("v")}}}}
}

func lookupAnswer(id uint64, kind pulsarpb.CommandLookupTopicResponse_LookupType, url string) *pulsarpb.BaseCommand {
	return &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_LOOKUP_RESPONSE.Enum(), LookupTopicResponse: &pulsarpb.CommandLookupTopicResponse{
		BrokerServiceUrl: proto.String(url), Response: kind.Enum(), RequestId: proto.Uint64(id), Authoritative: proto.Bool(true)}}
}

// redirectedLookup connects a raw client through the proxy to the service
// broker fb and sends LOOKUP 7, which fb receives.
func redirectedLookup(t *testing.T, addr string, fb *fakeBroker) (client, broker net.Conn) {
	t.Helper()
	client, broker = handshake(t, addr, fb, "")
	send(t, client, frame(t, lookupCmd(7)))
	expect(t, broker, pulsarpb.BaseCommand_LOOKUP)
	return client, broker
}

// acceptFollow takes the proxy's follow connection on target, checks the
// CONNECT is the client's, answers CONNECTED and returns the LOOKUP it then gets.
func acceptFollow(t *testing.T, target *fakeBroker) (net.Conn, *pulsarpb.CommandLookupTopic) {
	t.Helper()
	c := target.accept(t)
	cmd, _ := expect(t, c, pulsarpb.BaseCommand_CONNECT)
	if string(cmd.GetConnect().GetAuthData()) != "secret-token" || cmd.GetConnect().ProxyToBrokerUrl != nil {
		t.Fatalf("follow CONNECT is not the client's: %v", cmd.GetConnect())
	}
	send(t, c, frame(t, connectedCmd(1<<20)))
	cmd, _ = expect(t, c, pulsarpb.BaseCommand_LOOKUP)
	return c, cmd.GetLookupTopic()
}

func waitFlight(t *testing.T, srv *Server, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for srv.m.lookupsFlight.Load() != want {
		if time.Now().After(deadline) {
			t.Fatalf("lookups in flight = %d, want %d", srv.m.lookupsFlight.Load(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Given a client LOOKUP sent to service broker A, and a broker B that answers lookups with Connect,
// when A answers the LOOKUP with Redirect to B,
// then the proxy asks B itself (the client's CONNECT, the client's topic, listener name and
// properties, authoritative as A said, a PING answered), the client gets exactly B's Connect
// with its own request id and proxy_through_service_url=true, B becomes an allowed target,
// the outcome is counted and logged, and the lookup slot is free again.
func TestRedirectFollowedToConnect(t *testing.T) {
	a, b := newFakeBroker(t), newFakeBroker(t)
	srv, addr, logs := startProxy(t, []string{a.addr()}, nil)
	client, broker := redirectedLookup(t, addr, a)

	send(t, broker, frame(t, lookupAnswer(7, pulsarpb.CommandLookupTopicResponse_Redirect, "pulsar://"+b.addr())))

	fc, l := acceptFollow(t, b)
	if l.GetTopic() != redirTopic || !l.GetAuthoritative() || l.GetAdvertisedListenerName() != "internal" ||
		len(l.GetProperties()) != 1 || l.GetProperties()[0].GetKey() != "k" {
		t.Errorf("follow LOOKUP: %v", l)
	}
	send(t, fc, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PING.Enum(), Ping: &pulsarpb.CommandPing{}}))
	expect(t, fc, pulsarpb.BaseCommand_PONG)
	answer := lookupAnswer(l.GetRequestId(), pulsarpb.CommandLookupTopicResponse_Connect, "pulsar://"+b.addr())
	answer.LookupTopicResponse.BrokerServiceUrlTls = proto.String("pulsar+ssl://" + b.addr())
	send(t, fc, frame(t, answer))
	cmd, _ := expect(t, client, pulsarpb.BaseCommand_LOOKUP_RESPONSE)
	r := cmd.GetLookupTopicResponse()
	if r.GetResponse() != pulsarpb.CommandLookupTopicResponse_Connect || r.GetRequestId() != 7 || !r.GetProxyThroughServiceUrl() ||
		r.GetBrokerServiceUrl() != "pulsar://"+b.addr() || r.GetBrokerServiceUrlTls() != "pulsar+ssl://"+b.addr() || !r.GetAuthoritative() {
		t.Errorf("client got %v", r)
	}
	data := dial(t, addr)
	send(t, data, frame(t, connectCmd(b.addr())))
	expect(t, b.accept(t), pulsarpb.BaseCommand_CONNECT)
	logs.waitFor(t, "lookup redirect followed")
	if n := srv.m.lookups[lookupRedirectFollowed].Load(); n != 1 {
		t.Errorf("redirect_followed = %d", n)
	}
	waitFlight(t, srv, 0)
}

// Given a proxy following at most 3 redirects and a broker B that redirects every lookup to itself,
// when service broker A redirects a client LOOKUP to B,
// then B is asked exactly 3 times and the client gets Failed(ServiceNotReady) naming the topic and the bound.
func TestRedirectLoopHitsBound(t *testing.T) {
	a, b := newFakeBroker(t), newFakeBroker(t)
	srv, addr, _ := startProxy(t, []string{a.addr()}, func(c *Config) { c.MaxLookupRedirects = 3 })
	client, broker := redirectedLookup(t, addr, a)

	send(t, broker, frame(t, lookupAnswer(7, pulsarpb.CommandLookupTopicResponse_Redirect, "pulsar://"+b.addr())))

	for i := 0; i < 3; i++ {
		fc, l := acceptFollow(t, b)
		send(t, fc, frame(t, lookupAnswer(l.GetRequestId(), pulsarpb.CommandLookupTopicResponse_Redirect, "pulsar://"+b.addr())))
	}
	cmd, _ := expect(t, client, pulsarpb.BaseCommand_LOOKUP_RESPONSE)
	r := cmd.GetLookupTopicResponse()
	if r.GetResponse() != pulsarpb.CommandLookupTopicResponse_Failed || r.GetError() != pulsarpb.ServerError_ServiceNotReady ||
		r.GetRequestId() != 7 || !strings.Contains(r.GetMessage(), redirTopic) || !strings.Contains(r.GetMessage(), "more than 3 redirects") {
		t.Errorf("client got %v", r)
	}
	select {
	case <-b.conns:
		t.Error("the proxy asked B a fourth time")
	case <-time.After(50 * time.Millisecond):
	}
	if n := srv.m.lookups[lookupRedirectFailed].Load(); n != 1 {
		t.Errorf("redirect_failed = %d", n)
	}
	waitFlight(t, srv, 0)
}

// Given a redirect target nobody listens on,
// when service broker A redirects a client LOOKUP to it,
// then the client gets Failed(ServiceNotReady) naming the topic, and a warning is logged.
func TestRedirectTargetUnreachable(t *testing.T) {
	a := newFakeBroker(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	srv, addr, logs := startProxy(t, []string{a.addr()}, nil)
	client, broker := redirectedLookup(t, addr, a)

	send(t, broker, frame(t, lookupAnswer(7, pulsarpb.CommandLookupTopicResponse_Redirect, "pulsar://"+dead)))

	cmd, _ := expect(t, client, pulsarpb.BaseCommand_LOOKUP_RESPONSE)
	r := cmd.GetLookupTopicResponse()
	if r.GetResponse() != pulsarpb.CommandLookupTopicResponse_Failed || r.GetError() != pulsarpb.ServerError_ServiceNotReady ||
		r.GetRequestId() != 7 || !strings.Contains(r.GetMessage(), redirTopic) || !strings.Contains(r.GetMessage(), dead) {
		t.Errorf("client got %v", r)
	}
	logs.waitFor(t, "lookup redirect not followed")
	waitFlight(t, srv, 0)
}

// Given a redirect target that never answers the lookup,
// when service broker A redirects a client LOOKUP to it,
// then after the lookup timeout the client gets Failed(ServiceNotReady) saying so.
func TestRedirectTimeout(t *testing.T) {
	a, b := newFakeBroker(t), newFakeBroker(t)
	_, addr, _ := startProxy(t, []string{a.addr()}, func(c *Config) { c.LookupTimeout = 300 * time.Millisecond })
	client, broker := redirectedLookup(t, addr, a)

	send(t, broker, frame(t, lookupAnswer(7, pulsarpb.CommandLookupTopicResponse_Redirect, "pulsar://"+b.addr())))

	acceptFollow(t, b)
	cmd, _ := expect(t, client, pulsarpb.BaseCommand_LOOKUP_RESPONSE)
	r := cmd.GetLookupTopicResponse()
	if r.GetError() != pulsarpb.ServerError_ServiceNotReady || !strings.Contains(r.GetMessage(), "timeout") {
		t.Errorf("client got %v", r)
	}
}

// Given a redirect target that answers the lookup with Failed,
// when service broker A redirects a client LOOKUP to it,
// then the client gets that Failed answer under its own request id.
func TestRedirectTargetFailedRelayed(t *testing.T) {
	a, b := newFakeBroker(t), newFakeBroker(t)
	_, addr, _ := startProxy(t, []string{a.addr()}, nil)
	client, broker := redirectedLookup(t, addr, a)

	send(t, broker, frame(t, lookupAnswer(7, pulsarpb.CommandLookupTopicResponse_Redirect, "pulsar://"+b.addr())))

	fc, l := acceptFollow(t, b)
	send(t, fc, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_LOOKUP_RESPONSE.Enum(), LookupTopicResponse: &pulsarpb.CommandLookupTopicResponse{
		Response: pulsarpb.CommandLookupTopicResponse_Failed.Enum(), RequestId: l.RequestId,
		Error: pulsarpb.ServerError_AuthorizationError.Enum(), Message: proto.String("not allowed")}}))
	cmd, _ := expect(t, client, pulsarpb.BaseCommand_LOOKUP_RESPONSE)
	r := cmd.GetLookupTopicResponse()
	if r.GetRequestId() != 7 || r.GetError() != pulsarpb.ServerError_AuthorizationError || r.GetMessage() != "not allowed" {
		t.Errorf("client got %v", r)
	}
}

// Given a redirect target that cannot authenticate the client from the proxy's copy of its
// credentials (it answers CONNECT with AUTH_CHALLENGE, or refuses them with AuthenticationError),
// when service broker A redirects a client LOOKUP to it,
// then the client gets A's Redirect with proxy_through_service_url=true, as when following is
// off, and follows it itself.
func TestRedirectTargetThatCannotAuthenticateRelaysRedirect(t *testing.T) {
	cases := []struct {
		name   string
		answer *pulsarpb.BaseCommand
		log    string
	}{
		{"auth challenge", &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_AUTH_CHALLENGE.Enum(), AuthChallenge: &pulsarpb.CommandAuthChallenge{
			Challenge: &pulsarpb.AuthData{AuthMethodName: proto.String("sasl"), AuthData: []byte("x")}}}, "AUTH_CHALLENGE"},
		{"credentials refused", &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_ERROR.Enum(), Error: &pulsarpb.CommandError{
			RequestId: proto.Uint64(0), Error: pulsarpb.ServerError_AuthenticationError.Enum(), Message: proto.String("expired")}}, "refused the client's credentials"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := newFakeBroker(t), newFakeBroker(t)
			srv, addr, logs := startProxy(t, []string{a.addr()}, nil)
			client, broker := redirectedLookup(t, addr, a)

			send(t, broker, frame(t, lookupAnswer(7, pulsarpb.CommandLookupTopicResponse_Redirect, "pulsar://"+b.addr())))

			fc := b.accept(t)
			expect(t, fc, pulsarpb.BaseCommand_CONNECT)
			send(t, fc, frame(t, c.answer))
			cmd, _ := expect(t, client, pulsarpb.BaseCommand_LOOKUP_RESPONSE)
			r := cmd.GetLookupTopicResponse()
			if r.GetResponse() != pulsarpb.CommandLookupTopicResponse_Redirect || r.GetRequestId() != 7 || !r.GetProxyThroughServiceUrl() ||
				r.GetBrokerServiceUrl() != "pulsar://"+b.addr() || !r.GetAuthoritative() {
				t.Errorf("client got %v", r)
			}
			logs.waitFor(t, c.log)
			if n := srv.m.lookups[lookupRedirect].Load(); n != 1 {
				t.Errorf("redirect = %d", n)
			}
			waitFlight(t, srv, 0)
		})
	}
}

// Given a lookup connection whose client answered the broker's AUTH_CHALLENGE with fresh
// credentials (its token was refreshed),
// when the broker redirects a LOOKUP of that client,
// then the proxy's follow connection presents the fresh credentials, not those of the
// client's original CONNECT.
func TestRedirectFollowUsesRefreshedCredentials(t *testing.T) {
	a, b := newFakeBroker(t), newFakeBroker(t)
	_, addr, _ := startProxy(t, []string{a.addr()}, nil)
	client, broker := handshake(t, addr, a, "")
	send(t, broker, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_AUTH_CHALLENGE.Enum(), AuthChallenge: &pulsarpb.CommandAuthChallenge{
		Challenge: &pulsarpb.AuthData{AuthMethodName: proto.String("token"), AuthData: []byte("refresh")}}}))
	expect(t, client, pulsarpb.BaseCommand_AUTH_CHALLENGE)
	send(t, client, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_AUTH_RESPONSE.Enum(), AuthResponse: &pulsarpb.CommandAuthResponse{
		Response: &pulsarpb.AuthData{AuthMethodName: proto.String("token"), AuthData: []byte("fresh-token")}}}))
	expect(t, broker, pulsarpb.BaseCommand_AUTH_RESPONSE)
	send(t, client, frame(t, lookupCmd(7)))
	expect(t, broker, pulsarpb.BaseCommand_LOOKUP)

	send(t, broker, frame(t, lookupAnswer(7, pulsarpb.CommandLookupTopicResponse_Redirect, "pulsar://"+b.addr())))

	fc := b.accept(t)
	cmd, _ := expect(t, fc, pulsarpb.BaseCommand_CONNECT)
	if got := string(cmd.GetConnect().GetAuthData()); got != "fresh-token" || cmd.GetConnect().GetAuthMethodName() != "token" {
		t.Fatalf("follow CONNECT presents %q (%s), want the refreshed token", got, cmd.GetConnect().GetAuthMethodName())
	}
}

// Given a proxy that relays redirects (max redirects 0),
// when service broker A answers a client LOOKUP with Redirect,
// then the client gets it rewritten with proxy_through_service_url=true and nobody else is asked.
func TestRedirectRelayedWhenFollowingOff(t *testing.T) {
	a, b := newFakeBroker(t), newFakeBroker(t)
	_, addr, _ := startProxy(t, []string{a.addr()}, func(c *Config) { c.MaxLookupRedirects = 0 })
	client, broker := redirectedLookup(t, addr, a)

	send(t, broker, frame(t, lookupAnswer(7, pulsarpb.CommandLookupTopicResponse_Redirect, "pulsar://"+b.addr())))

	cmd, _ := expect(t, client, pulsarpb.BaseCommand_LOOKUP_RESPONSE)
	r := cmd.GetLookupTopicResponse()
	if r.GetResponse() != pulsarpb.CommandLookupTopicResponse_Redirect || !r.GetProxyThroughServiceUrl() || r.GetRequestId() != 7 {
		t.Errorf("client got %v", r)
	}
	select {
	case <-b.conns:
		t.Error("the proxy followed the redirect")
	case <-time.After(50 * time.Millisecond):
	}
}

// Given a redirect being followed (the target accepted the proxy's connection but has not answered),
// when the client closes its connection,
// then the lookup slot is released and the follow connection is closed.
func TestClientClosingMidFollowReleasesSlot(t *testing.T) {
	a, b := newFakeBroker(t), newFakeBroker(t)
	srv, addr, _ := startProxy(t, []string{a.addr()}, nil)
	client, broker := redirectedLookup(t, addr, a)
	send(t, broker, frame(t, lookupAnswer(7, pulsarpb.CommandLookupTopicResponse_Redirect, "pulsar://"+b.addr())))
	fc := b.accept(t)
	expect(t, fc, pulsarpb.BaseCommand_CONNECT)
	if n := srv.m.lookupsFlight.Load(); n != 1 {
		t.Fatalf("lookups in flight during the follow = %d, want 1", n)
	}

	client.Close()

	waitFlight(t, srv, 0)
	expectClosed(t, fc)
}
