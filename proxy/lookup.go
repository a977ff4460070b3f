package proxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Following lookup redirects (doc.go, contract 1).
//
// A broker answers a LOOKUP with Redirect when another broker (or another
// cluster) must be asked. Clients that talk to the proxy cannot always reach
// that broker themselves, and the Java client sends the redirected lookup
// straight to it, so the proxy asks the chain of brokers itself and gives
// the client only the final answer:
//
//   - onLookupRequest remembers each admitted client LOOKUP (noteLookup):
//     request id -> the decoded request. Entries leave on the answer; their
//     number is bounded by the concurrent-lookup slots they hold.
//   - When the broker's answer is a Redirect for a remembered request,
//     takeRedirect does not relay it: it starts a goroutine (follow) that
//     opens one short-lived plain TCP connection per hop to the named
//     broker, sends the client's own CONNECT (the broker authenticates the
//     client, as on every connection the proxy opens), waits for CONNECTED,
//     sends the client's LOOKUP under the proxy's request id with the
//     redirect's authoritative flag, and reads until its answer, answering
//     PING with PONG. Further Redirects are followed up to
//     Config.MaxLookupRedirects; the whole chain is bounded by
//     Config.LookupTimeout. (One connection per hop keeps the follow
//     self-contained; pooling connections per target would save a
//     handshake per hop and is a possible later improvement.)
//   - The outcome is handed to the loop with EventLoop.Execute
//     (finishFollow), which writes the client's answer through ToClient,
//     releases the lookup slot and forgets the request. A session closed
//     meanwhile drops it; closing cancels the follow (stopFollows).
//
// Answers: Connect is sent with the client's request id,
// proxy_through_service_url=true and every other field kept, and its broker
// is learned as an allowed target; a broker's Failed is relayed with the
// client's request id; an unreachable target, a timeout, a refused CONNECT
// or too many redirects is answered Failed(ServiceNotReady) naming the topic
// and the reason. A target that answers the CONNECT with AUTH_CHALLENGE
// (multi-stage authentication the proxy cannot complete for the client)
// makes the proxy relay the Redirect naming that target, rewritten with
// proxy_through_service_url=true, as when following is off: the client then
// follows it through the proxy and does the challenge itself.

// pendingLookup is a client LOOKUP awaiting its answer. Loop-owned.
type pendingLookup struct {
	req *pulsarpb.CommandLookupTopic // the client's request, decoded (its request id is the client's)
}

// followRequestID is the request id of the proxy's own LOOKUP on a follow
// connection; the connection carries nothing else.
const followRequestID = 1

// keepConnectForLookups keeps the CONNECT the broker receives (the client's,
// proxy_to_broker_url removed) for following redirects. Runs on the loop
// from onConnect; the frame is never modified afterwards (noteAuthResponse
// replaces it).
func (s *session) keepConnectForLookups() {
	if s.srv.cfg.MaxLookupRedirects > 0 {
		s.lookupConnect = s.connectFrame
	}
}

// noteAuthResponse keeps the credentials the client sends in an
// AUTH_RESPONSE on an established connection (a refreshed token, answering
// the broker's AUTH_CHALLENGE) for the CONNECT of later follow connections,
// so they do not present credentials the broker has since let expire. The
// frame is rebuilt, never modified: follows in progress keep reading the
// old one. Runs on the loop.
func (s *session) noteAuthResponse(f wire.Frame) {
	if s.lookupConnect == nil || s.proxyRole || wire.DecodeCommand(f, &s.cmd) != nil {
		return
	}
	ad := s.cmd.GetAuthResponse().GetResponse()
	if ad == nil || ad.AuthData == nil {
		return
	}
	var connect pulsarpb.BaseCommand
	cf, _, err := wire.ReadFrame(s.lookupConnect, len(s.lookupConnect))
	if err != nil || wire.DecodeCommand(cf, &connect) != nil || connect.Connect == nil {
		return
	}
	connect.Connect.AuthData = ad.AuthData
	if ad.AuthMethodName != nil {
		connect.Connect.AuthMethodName = ad.AuthMethodName
	}
	if b, err := wire.AppendCommandFrame(nil, &connect); err == nil {
		s.lookupConnect = b
	}
}

// noteLookup remembers an admitted client LOOKUP so a Redirect answering it
// can be followed. Runs on the loop.
func (s *session) noteLookup(f wire.Frame) {
	if f.Type() != pulsarpb.BaseCommand_LOOKUP || s.lookupConnect == nil {
		return
	}
	if wire.DecodeCommand(f, &s.cmd) != nil {
		return // the broker will answer it as it sees fit; nothing to follow
	}
	l := s.cmd.GetLookupTopic()
	if l == nil {
		return
	}
	if s.lookupReqs == nil {
		s.lookupReqs = map[uint64]*pendingLookup{}
	}
	s.lookupReqs[l.GetRequestId()] = &pendingLookup{req: proto.Clone(l).(*pulsarpb.CommandLookupTopic)}
}

// takeRedirect looks at a LOOKUP_RESPONSE from the broker. It forgets the
// pending request the answer settles, unless the answer is a Redirect the
// proxy follows: then it starts the follow and reports true, and the answer
// is not relayed; the request's lookup slot stays held until finishFollow
// writes the final answer. Runs on the loop.
func (s *session) takeRedirect(f wire.Frame) (bool, error) {
	if s.lookupReqs == nil {
		return false, nil
	}
	if err := wire.DecodeCommand(f, &s.cmd); err != nil {
		return false, err
	}
	r := s.cmd.GetLookupTopicResponse()
	if r == nil {
		return false, wire.ErrMalformedCommand
	}
	p := s.lookupReqs[r.GetRequestId()]
	if p == nil {
		return false, nil
	}
	if r.GetResponse() != pulsarpb.CommandLookupTopicResponse_Redirect || s.clientGone {
		delete(s.lookupReqs, r.GetRequestId())
		return false, nil
	}
	if s.followCtx == nil {
		s.followCtx, s.followCancel = context.WithCancel(context.Background())
	}
	fl := &follow{
		ctx:            s.followCtx,
		connect:        s.lookupConnect,
		req:            p.req,
		first:          proto.Clone(r).(*pulsarpb.CommandLookupTopicResponse),
		max:            s.srv.cfg.MaxLookupRedirects,
		connectTimeout: s.srv.cfg.ConnectTimeout,
		timeout:        s.srv.cfg.LookupTimeout,
		maxMsg:         s.srv.cfg.MaxMessageSize,
		known:          s.srv.known,
		dial:           s.srv.dialBrokerConn,
		tlsBrokers:     s.srv.brokerTLS != nil,
	}
	start := time.Now()
	go func() {
		out := fl.run()
		e := s.exec.run(func() { s.finishFollow(p, out, time.Since(start)) })
		if e != nil {
			// The engine is stopping: the session's close releases the slot.
			s.srv.log.Debug("lookup redirect outcome dropped", "conn", s.id, "err", e)
		}
	}()
	return true, nil
}

// finishFollow answers the client's LOOKUP with the outcome of following its
// redirects. Runs on the loop (an Execute task, never inside a pump).
func (s *session) finishFollow(p *pendingLookup, out followOutcome, took time.Duration) {
	if s.state == stClosed {
		return // onClose released the slot
	}
	reqID := p.req.GetRequestId()
	if s.lookupReqs[reqID] == p {
		delete(s.lookupReqs, reqID)
	}
	defer s.lookupDone()
	if s.clientGone {
		return
	}
	topic := p.req.GetTopic()
	log := s.logger().With("request_id", reqID, "topic", topic, "hops", out.hops, "took", took.Round(time.Millisecond))
	var resp *pulsarpb.CommandLookupTopicResponse
	var result int
	switch {
	case out.err != nil:
		result = lookupRedirectFailed
		msg := fmt.Sprintf("Proxy could not follow the lookup redirects for %s: %v", topic, out.err)
		resp = &pulsarpb.CommandLookupTopicResponse{Response: pulsarpb.CommandLookupTopicResponse_Failed.Enum(),
			Error: pulsarpb.ServerError_ServiceNotReady.Enum(), Message: &msg}
		log.Warn("lookup redirect not followed; answered ServiceNotReady", "target", out.target, "reason", out.err.Error())
	case out.challenged != nil:
		result = lookupRedirect
		resp = out.challenged
		throughProxy(resp, s.tlsClient, s.srv.brokerTLS != nil)
		log.Info("lookup redirect target cannot authenticate the client through the proxy; relaying the redirect to the client",
			"target", out.target, "reason", out.why.Error())
	case out.answer.GetResponse() == pulsarpb.CommandLookupTopicResponse_Connect:
		result = lookupRedirectFollowed
		resp = out.answer
		learned := throughProxy(resp, s.tlsClient, s.srv.brokerTLS != nil)
		s.srv.known.learn(learned)
		log.Info("lookup redirect followed", "final_broker", resp.GetBrokerServiceUrl())
	default:
		result = lookupFailed
		resp = out.answer
		log.Warn("lookup redirect followed to a failed answer", "target", out.target,
			"error", resp.GetError().String(), "message", resp.GetMessage())
	}
	resp.RequestId = proto.Uint64(reqID)
	b, err := wire.AppendCommandFrame(nil, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_LOOKUP_RESPONSE.Enum(), LookupTopicResponse: resp})
	if err == nil {
		s.srv.m.lookups[result].Add(1)
		s.pumpFail = nil
		s.ToClient(b)
		err = s.pumpFail
	}
	if err != nil {
		if s.reason == nil {
			s.reason = fmt.Errorf("answering a followed lookup: %w", err)
		}
		s.client.Close()
	}
}

// stopFollows cancels the session's redirect follows. Runs on the loop from
// onClose.
func (s *session) stopFollows() {
	if s.followCancel != nil {
		s.followCancel()
	}
}

// addrOf returns the host:port of a broker URL, or "" when it has none the
// proxy can dial (learning "" is a no-op).
func addrOf(u string) string {
	if u == "" {
		return ""
	}
	a, err := BrokerAddress(u)
	if err != nil {
		return ""
	}
	return a
}

// follow is one chain of redirects followed off the loop. It shares nothing
// mutable with the session: its fields are copies or read-only.
type follow struct {
	ctx            context.Context
	connect        []byte                               // the client's CONNECT frame, read-only
	req            *pulsarpb.CommandLookupTopic         // the client's LOOKUP, read-only
	first          *pulsarpb.CommandLookupTopicResponse // the broker's Redirect
	max            int
	connectTimeout time.Duration
	timeout        time.Duration
	maxMsg         int
	known          *knownBrokers
	// dial connects to a broker (TLS when tlsBrokers: the targets are then
	// the redirects' TLS URLs).
	dial       func(ctx context.Context, addr string) (net.Conn, error)
	tlsBrokers bool
}

// followOutcome is how a chain ended: a broker's final answer (Connect or
// Failed), the Redirect to relay because its target challenged the CONNECT,
// or err (the proxy gives up).
type followOutcome struct {
	answer     *pulsarpb.CommandLookupTopicResponse
	challenged *pulsarpb.CommandLookupTopicResponse
	why        error // why challenged: errChallenged or errAuthRefused
	err        error
	hops       int    // lookups the proxy sent
	target     string // the broker URL asked last
}

// errChallenged and errAuthRefused report a target that cannot authenticate
// the client from the proxy's copy of its credentials: it answers CONNECT
// with AUTH_CHALLENGE (multi-stage authentication), or refuses them with
// AuthenticationError. The client is better placed to follow that redirect
// itself.
var errChallenged = errors.New("target answered CONNECT with AUTH_CHALLENGE")

// errAuthRefused: see errChallenged.
var errAuthRefused = errors.New("target refused the client's credentials")

// run follows the chain. It runs on its own goroutine.
func (fl *follow) run() followOutcome {
	deadline := time.Now().Add(fl.timeout)
	redirect := fl.first
	var out followOutcome
	for {
		if out.hops >= fl.max {
			out.err = fmt.Errorf("more than %d redirects (last to %s)", fl.max, redirect.GetBrokerServiceUrl())
			return out
		}
		out.target = redirect.GetBrokerServiceUrl()
		if fl.tlsBrokers {
			out.target = redirect.GetBrokerServiceUrlTls()
		}
		if out.target == "" {
			out.err = fmt.Errorf("a broker redirected to no broker URL the proxy can dial (plaintext %q, TLS %q)",
				redirect.GetBrokerServiceUrl(), redirect.GetBrokerServiceUrlTls())
			return out
		}
		addr, err := BrokerAddress(out.target)
		if err != nil {
			out.err = fmt.Errorf("redirect target %q: %v", out.target, err)
			return out
		}
		fl.known.learn(addr)
		out.hops++
		resp, err := fl.ask(addr, redirect.GetAuthoritative(), deadline)
		switch {
		case errors.Is(err, errChallenged), errors.Is(err, errAuthRefused):
			out.challenged, out.why = redirect, err
			return out
		case err != nil:
			if time.Now().After(deadline) {
				err = fmt.Errorf("lookup timeout (%v) reached: %w", fl.timeout, err)
			}
			out.err = fmt.Errorf("asking %s: %w", out.target, err)
			return out
		case resp.GetResponse() == pulsarpb.CommandLookupTopicResponse_Redirect:
			redirect = resp
		default:
			out.answer = resp
			return out
		}
	}
}

// ask performs one hop: connect to addr as the client, look the topic up,
// return the broker's answer.
func (fl *follow) ask(addr string, authoritative bool, deadline time.Time) (*pulsarpb.CommandLookupTopicResponse, error) {
	dctx, cancel := context.WithDeadline(fl.ctx, deadline)
	nc, err := fl.dial(dctx, addr)
	cancel()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	stop := context.AfterFunc(fl.ctx, func() { _ = nc.Close() })
	defer stop()
	if err := nc.SetDeadline(deadline); err != nil {
		return nil, err
	}
	fr := frameReader{r: bufio.NewReaderSize(nc, 4096), maxMsg: fl.maxMsg}
	if _, err := nc.Write(fl.connect); err != nil {
		return nil, err
	}
	var cmd pulsarpb.BaseCommand
	for connected := false; !connected; {
		if err := fr.next(&cmd); err != nil {
			return nil, err
		}
		switch cmd.GetType() {
		case pulsarpb.BaseCommand_CONNECTED:
			connected = true
		case pulsarpb.BaseCommand_AUTH_CHALLENGE:
			return nil, errChallenged
		case pulsarpb.BaseCommand_ERROR:
			e := cmd.GetError()
			if e.GetError() == pulsarpb.ServerError_AuthenticationError {
				return nil, fmt.Errorf("%w: %s", errAuthRefused, e.GetMessage())
			}
			return nil, fmt.Errorf("CONNECT refused: %s: %s", e.GetError(), e.GetMessage())
		case pulsarpb.BaseCommand_PING:
			if _, err := nc.Write(wire.AppendPongFrame(nil)); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("%s before CONNECTED", cmd.GetType())
		}
	}
	l := proto.Clone(fl.req).(*pulsarpb.CommandLookupTopic)
	l.RequestId = proto.Uint64(followRequestID)
	l.Authoritative = proto.Bool(authoritative)
	b, err := wire.AppendCommandFrame(nil, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_LOOKUP.Enum(), LookupTopic: l})
	if err != nil {
		return nil, err
	}
	if _, err := nc.Write(b); err != nil {
		return nil, err
	}
	for {
		if err := fr.next(&cmd); err != nil {
			return nil, err
		}
		switch cmd.GetType() {
		case pulsarpb.BaseCommand_LOOKUP_RESPONSE:
			if r := cmd.GetLookupTopicResponse(); r.GetRequestId() == followRequestID {
				return r, nil
			}
		case pulsarpb.BaseCommand_PING:
			if _, err := nc.Write(wire.AppendPongFrame(nil)); err != nil {
				return nil, err
			}
		}
	}
}

// frameReader reads whole frames from a blocking connection.
type frameReader struct {
	r      *bufio.Reader
	maxMsg int
	buf    []byte
}

// next reads one frame and decodes its command into cmd.
func (fr *frameReader) next(cmd *pulsarpb.BaseCommand) error {
	var hdr [4]byte
	if _, err := io.ReadFull(fr.r, hdr[:]); err != nil {
		return err
	}
	n, err := wire.FrameLen(hdr[:], fr.maxMsg)
	if err != nil {
		return err
	}
	if cap(fr.buf) < n {
		fr.buf = make([]byte, n)
	}
	b := fr.buf[:n]
	binary.BigEndian.PutUint32(b, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(fr.r, b[4:]); err != nil {
		return err
	}
	f, _, err := wire.ReadFrame(b, fr.maxMsg)
	if err != nil {
		return err
	}
	return wire.DecodeCommand(f, cmd)
}
