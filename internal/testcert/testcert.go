// Package testcert makes TLS certificates at test time (never checked in): a CA and
// certificates it signs for loopback servers and for clients.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Files are PEM files written by Write.
type Files struct {
	CA         string // the CA certificate
	ServerCert string // a server certificate for 127.0.0.1, ::1 and localhost
	ServerKey  string
	ClientCert string // a client certificate with common name "client"
	ClientKey  string
	// OtherCA signs nothing above: a CA clients and servers must not trust.
	OtherCA string
}

// Write makes a CA, a server and a client certificate valid for a day, and an unrelated CA,
// as PEM files in dir.
func Write(dir string) (Files, error) {
	ca, caKey, caPEM, err := newCA("test CA")
	if err != nil {
		return Files{}, err
	}
	_, _, otherPEM, err := newCA("untrusted CA")
	if err != nil {
		return Files{}, err
	}
	f := Files{CA: filepath.Join(dir, "ca.pem"), ServerCert: filepath.Join(dir, "server.pem"), ServerKey: filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client-key.pem"), OtherCA: filepath.Join(dir, "other-ca.pem")}
	srv := &x509.Certificate{Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	cli := &x509.Certificate{Subject: pkix.Name{CommonName: "client"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	for _, c := range []struct {
		tmpl      *x509.Certificate
		cert, key string
	}{{srv, f.ServerCert, f.ServerKey}, {cli, f.ClientCert, f.ClientKey}} {
		certPEM, keyPEM, err := sign(c.tmpl, ca, caKey)
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

func sign(tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}
