package etcdtest

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
	"testing"
	"time"
)

// Certs are PEM files: a CA, a server certificate for 127.0.0.1 and a
// client certificate, both signed by the CA, and a second CA that signed
// neither (for tests of refused peers).
type Certs struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
	OtherCA                                          string
}

// WriteCerts writes a fresh PKI under dir.
func WriteCerts(tb testing.TB, dir string) *Certs {
	tb.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	c := &Certs{
		CA: filepath.Join(dir, "ca.pem"), ServerCert: filepath.Join(dir, "server.pem"),
		ServerKey: filepath.Join(dir, "server-key.pem"), ClientCert: filepath.Join(dir, "client.pem"),
		ClientKey: filepath.Join(dir, "client-key.pem"), OtherCA: filepath.Join(dir, "other-ca.pem"),
	}
	caKey, caCert := newCA(tb, c.CA, "etcdtest-ca")
	newCA(tb, c.OtherCA, "etcdtest-other-ca")
	issue(tb, caKey, caCert, c.ServerCert, c.ServerKey, x509.ExtKeyUsageServerAuth)
	issue(tb, caKey, caCert, c.ClientCert, c.ClientKey, x509.ExtKeyUsageClientAuth)
	return c
}

func newCA(tb testing.TB, path, name string) (*ecdsa.PrivateKey, *x509.Certificate) {
	tb.Helper()
	key := genKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("create CA: %v", err)
	}
	writePEM(tb, path, "CERTIFICATE", der)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return key, cert
}

func issue(tb testing.TB, caKey *ecdsa.PrivateKey, ca *x509.Certificate, certPath, keyPath string, usage x509.ExtKeyUsage) {
	tb.Helper()
	key := genKey(tb)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "etcdtest"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		tb.Fatalf("issue certificate: %v", err)
	}
	writePEM(tb, certPath, "CERTIFICATE", der)
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	writePEM(tb, keyPath, "EC PRIVATE KEY", kder)
}

func genKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return key
}

func writePEM(tb testing.TB, path, typ string, der []byte) {
	tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
}
