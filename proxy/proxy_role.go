package proxy

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// TLS client-certificate authentication through a terminating proxy.
//
// A client that authenticates with its TLS certificate sends CONNECT with auth_method_name
// "tls" and no data: the broker is meant to read the certificate from the TLS session. Behind
// this proxy the broker's TLS session is the proxy's, so the broker never sees the client's
// certificate. As Pulsar's own proxy does, the proxy then authenticates the client itself (its
// TLS listener verified the certificate against TLSClientCAFile; the role is the certificate's
// subject common name, as the broker's AuthenticationProviderTls derives it) and connects to the
// broker with its own credentials (Config.BrokerClientAuth: its broker-side TLS certificate, or
// a token), naming the client's role in original_principal and "tls" in original_auth_method.
// The broker must list the proxy's role in proxyRoles; it then authorizes the original
// principal (and, on Pulsar's rules, the proxy role too). authenticateOriginalAuthData must stay
// false for these clients: a certificate cannot be forwarded as data.
//
// Refused with AuthenticationError, and logged: a "tls" CONNECT without a verified client
// certificate, or with one that names no common name, when BrokerClientAuth is set; and any
// "tls" CONNECT when BrokerClientAuth is unset but the proxy presents a certificate of its own
// to the brokers (BrokerTLSCertFile), since the broker would authenticate the client as the
// proxy. Other authentication methods (token, and any that carry data) pass through unchanged.

// Authentication method names, as the clients and the broker spell them.
const (
	authMethodTLS   = "tls"
	authMethodToken = "token"
)

// ErrClientAuthRefused means the proxy refused a client's TLS client-certificate
// authentication (see proxy_role.go for the rules).
var ErrClientAuthRefused = errors.New("proxy: client authentication refused")

// BrokerClientAuth is the proxy's own credential towards the brokers, used on behalf of clients
// that authenticate with a TLS certificate. Method is "tls" (the proxy's broker-side TLS
// certificate, Config.BrokerTLSCertFile, carries it) or "token" (TokenFile's contents, re-read
// on each use so a rotated token is picked up).
type BrokerClientAuth struct {
	Method    string
	TokenFile string
}

// validate checks the credential against the rest of the configuration.
func (a *BrokerClientAuth) validate(c *Config) error {
	switch a.Method {
	case authMethodTLS:
		if !c.BrokerTLS || c.BrokerTLSCertFile == "" {
			return fmt.Errorf("broker-client-auth tls: needs pulsar+ssl:// broker URLs and broker-tls-cert/broker-tls-key (the proxy's certificate is its credential)")
		}
	case authMethodToken:
		if _, err := a.data(); err != nil {
			return fmt.Errorf("broker-client-auth token: %v", err)
		}
	default:
		return fmt.Errorf("broker-client-auth: method %q: want tls or token:FILE", a.Method)
	}
	if (c.TLSListen == "" && c.WebTLSListen == "") || c.TLSClientCAFile == "" {
		return fmt.Errorf("broker-client-auth: needs tls-listen or web-tls-listen, and tls-client-ca (it authenticates clients by their verified TLS certificates)")
	}
	if a.Method == authMethodTLS && c.WebTLSListen != "" {
		for _, u := range c.BrokerWebURLs {
			if !strings.HasPrefix(u, "https://") {
				return fmt.Errorf("broker-client-auth tls with web-tls-listen: broker-web-url %q must be https:// (the proxy's certificate is its credential there too)", u)
			}
		}
	}
	return nil
}

// data returns the credential's auth_data: nothing for tls, the token for token.
func (a *BrokerClientAuth) data() ([]byte, error) {
	if a.Method != authMethodToken {
		return nil, nil
	}
	b, err := os.ReadFile(a.TokenFile)
	if err != nil {
		return nil, err
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, fmt.Errorf("%s is empty", a.TokenFile)
	}
	return b, nil
}

// certRole is the role the broker's AuthenticationProviderTls gives a verified client
// certificate: its subject's common name. Any goroutine.
func certRole(chains [][]*x509.Certificate) (role string, verified bool) {
	if len(chains) == 0 || len(chains[0]) == 0 {
		return "", false
	}
	return chains[0][0].Subject.CommonName, true
}

// authenticateTLSClient applies the rules above to a client CONNECT whose auth_method_name is
// "tls", rewriting c in place when the proxy connects on the client's behalf. It returns the
// message to refuse the client with, or "" to go on. Runs on the loop.
func (s *session) authenticateTLSClient(c *pulsarpb.CommandConnect) (refusal string, err error) {
	a := s.srv.cfg.BrokerClientAuth
	if a == nil {
		if s.srv.cfg.BrokerTLSCertFile != "" {
			return "TLS client-certificate authentication is not configured on this proxy (broker-client-auth): the broker would see the proxy's certificate, not the client's", nil
		}
		return "", nil // the broker judges it (it sees no certificate)
	}
	if !s.clientCertVerified {
		return "TLS client-certificate authentication needs a client certificate trusted by the proxy, on its TLS port", nil
	}
	if s.clientCertRole == "" {
		return "the client certificate has no subject common name to use as the role", nil
	}
	data, err := a.data()
	if err != nil {
		return "", fmt.Errorf("proxy credential: %w", err)
	}
	c.AuthMethodName, c.AuthData = proto.String(a.Method), data
	c.AuthMethod = nil
	c.OriginalPrincipal, c.OriginalAuthMethod, c.OriginalAuthData = proto.String(s.clientCertRole), proto.String(authMethodTLS), nil
	s.proxyRole = true
	return "", nil
}

// answerChallenge answers the broker's AUTH_CHALLENGE on a connection the proxy authenticated
// with its own credential (authenticateTLSClient): the broker checks the proxy's credential, so
// the client is not asked. Runs on the loop.
func (s *session) answerChallenge() error {
	data, err := s.srv.cfg.BrokerClientAuth.data()
	if err != nil {
		return fmt.Errorf("proxy credential for AUTH_CHALLENGE: %w", err)
	}
	cmd := pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_AUTH_RESPONSE.Enum(), AuthResponse: &pulsarpb.CommandAuthResponse{
		ClientVersion:   proto.String("rebatchproxy"),
		ProtocolVersion: proto.Int32(s.clientProtocol),
		Response:        &pulsarpb.AuthData{AuthMethodName: proto.String(s.srv.cfg.BrokerClientAuth.Method), AuthData: data},
	}}
	b, err := wire.AppendCommandFrame(nil, &cmd)
	if err != nil {
		return err
	}
	// writeOut, not the side's Write: a frame being cut through to the broker (contract 8)
	// must not be split by this one.
	s.writeOut(toBroker, b, true)
	return nil
}
