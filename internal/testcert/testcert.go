// Package testcert makes TLS certificates at test time (never checked in): a CA and
// certificates it signs for loopback servers and for clients.
package testcert

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Files are PEM files written by Write.
type Files struct {
	CA         string // the CA certificate
	ServerCert string // a server certificate for 127.0.0.1, ::1 and localhost
	ServerKey  string
	ClientCert string // a client certificate with common name "client"
	ClientKey  string
	// ProxyCert is a client certificate with common name "proxy" (a proxy's own credential).
	ProxyCert, ProxyKey string
	// OtherClientCert is a client certificate with common name "other", signed by the CA.
	OtherClientCert, OtherClientKey string
	// ExpiredClientCert is a client certificate with common name "client", signed by the CA,
	// that expired an hour ago.
	ExpiredClientCert, ExpiredClientKey string
	// UntrustedClientCert is a client certificate with common name "client" signed by OtherCA.
	UntrustedClientCert, UntrustedClientKey string
	// OtherCA signs only UntrustedClientCert: a CA clients and servers must not trust.
	OtherCA string
}

// Write makes a CA, a server certificate and the client certificates of Files, valid for a
// day unless said otherwise, and an unrelated CA, as PEM files in dir.
func Write(dir string) (Files, error) {
	ca, caKey, caPEM, err := newCA("test CA")
	if err != nil {
		return Files{}, err
	}
	other, otherKey, otherPEM, err := newCA("untrusted CA")
	if err != nil {
		return Files{}, err
	}
	f := names(dir)
	srv := &x509.Certificate{Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	client := func(cn string) *x509.Certificate {
		return &x509.Certificate{Subject: pkix.Name{CommonName: cn}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	}
	now := time.Now()
	for _, c := range []struct {
		tmpl      *x509.Certificate
		ca        *x509.Certificate
		caKey     *ecdsa.PrivateKey
		until     time.Time
		cert, key string
	}{
		{srv, ca, caKey, now.Add(24 * time.Hour), f.ServerCert, f.ServerKey},
		{client("client"), ca, caKey, now.Add(24 * time.Hour), f.ClientCert, f.ClientKey},
		{client("proxy"), ca, caKey, now.Add(24 * time.Hour), f.ProxyCert, f.ProxyKey},
		{client("other"), ca, caKey, now.Add(24 * time.Hour), f.OtherClientCert, f.OtherClientKey},
		{client("client"), ca, caKey, now.Add(-time.Hour), f.ExpiredClientCert, f.ExpiredClientKey},
		{client("client"), other, otherKey, now.Add(24 * time.Hour), f.UntrustedClientCert, f.UntrustedClientKey},
	} {
		certPEM, keyPEM, err := sign(c.tmpl, c.ca, c.caKey, c.until)
		if err != nil {
			return Files{}, err
		}
		if err := os.WriteFile(c.cert, certPEM, 0o600); err != nil {
			return Files{}, err
		}
		if err := os.WriteFile(c.key, keyPEM, 0o600); err != nil {
			return Files{}, err
		}
	}
	if err := os.WriteFile(f.CA, caPEM, 0o600); err != nil {
		return Files{}, err
	}
	return f, os.WriteFile(f.OtherCA, otherPEM, 0o600)
}

// Names returns the paths Write uses in dir, for a process reading files another wrote.
func Names(dir string) (Files, error) {
	f := names(dir)
	for _, p := range []string{f.CA, f.ServerCert, f.ServerKey} {
		if _, err := os.Stat(p); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

func names(dir string) Files {
	path := func(name string) string { return filepath.Join(dir, name) }
	return Files{CA: path("ca.pem"), ServerCert: path("server.pem"), ServerKey: path("server-key.pem"),
		ClientCert: path("client.pem"), ClientKey: path("client-key.pem"), ProxyCert: path("proxy.pem"), ProxyKey: path("proxy-key.pem"),
		OtherClientCert: path("other.pem"), OtherClientKey: path("other-key.pem"),
		ExpiredClientCert: path("expired.pem"), ExpiredClientKey: path("expired-key.pem"),
		UntrustedClientCert: path("untrusted.pem"), UntrustedClientKey: path("untrusted-key.pem"), OtherCA: path("other-ca.pem")}
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

func newCA(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), err
}

// sign makes a certificate from tmpl signed by ca. Client certificates get RSA keys: the Java
// client 2.10 reads only RSA private keys ("Version must be 0" for an EC one).
func sign(tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey, until time.Time) (certPEM, keyPEM []byte, err error) {
	var key crypto.Signer
	if slices.Contains(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	} else {
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore, tmpl.NotAfter = until.Add(-25*time.Hour), until
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}
