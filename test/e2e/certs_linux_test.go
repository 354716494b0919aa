//go:build linux

package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// writeCredentials writes the API server's self-signed serving
// certificate (also the CA every client trusts, and the root CA the
// controller manager publishes as kube-root-ca.crt), the service-account
// key and the static token file: admin (system:masters, the tests and the
// agents), kube-controller-manager and kube-scheduler (the users their
// bootstrap RBAC roles name) and one system:node:<name> token per kubelet
// (Node authorizer, NodeRestriction), and the API server's client
// certificate for the kubelets (kubelet-client.crt, signed by the serving
// certificate, which the kubelets trust as their client CA: exec, logs and
// port-forward go through it). It returns the tokens by user.
func writeCredentials(dir string, apiIP net.IP, nodes []string) (map[string]string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "membrane-e2e"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		// ClientAuth too: as a CA it signs kubelet-client.crt, and Go's
		// verification wants a CA's key usages to cover its leaves'.
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{apiIP, net.IPv4(127, 0, 0, 1), net.IPv4(10, 96, 0, 1)},
		DNSNames:              []string{"localhost", "kubernetes.default.svc"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	kcKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("kubelet client key: %w", err)
	}
	kcDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &kcKey.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("kubelet client certificate: %w", err)
	}
	kcKeyDER, err := x509.MarshalECPrivateKey(kcKey)
	if err != nil {
		return nil, err
	}
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("service-account key: %w", err)
	}
	for _, f := range []struct {
		name, typ string
		der       []byte
	}{
		{"tls.crt", "CERTIFICATE", der},
		{"tls.key", "EC PRIVATE KEY", keyDER},
		{"sa.key", "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)},
		{"kubelet-client.crt", "CERTIFICATE", kcDER},
		{"kubelet-client.key", "EC PRIVATE KEY", kcKeyDER},
	} {
		data := pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der})
		if err := os.WriteFile(filepath.Join(dir, f.name), data, 0o600); err != nil {
			return nil, err
		}
	}
	tokens := map[string]string{"admin": randomToken()}
	csv := fmt.Sprintf("%s,admin,admin-uid,\"system:masters\"\n", tokens["admin"])
	for _, c := range []string{"kube-controller-manager", "kube-scheduler"} {
		tokens[c] = randomToken()
		csv += fmt.Sprintf("%s,system:%s,%s-uid\n", tokens[c], c, c)
	}
	for _, n := range nodes {
		tokens[n] = randomToken()
		csv += fmt.Sprintf("%s,system:node:%s,node-%s,\"system:nodes\"\n", tokens[n], n, n)
	}
	return tokens, os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(csv), 0o600)
}

func randomToken() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// writeKubeconfig writes a kubeconfig for server with a bearer token.
func writeKubeconfig(path, server, caFile, token string) error {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: u, user: {token: %q}}]
contexts: [{name: e2e, context: {cluster: e2e, user: u}}]
current-context: e2e
`, server, caFile, token)
	return os.WriteFile(path, []byte(cfg), 0o600)
}
