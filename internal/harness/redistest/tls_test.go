package redistest

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
)

func TestCertsChainToTheCA(t *testing.T) {
	t.Parallel()
	c := NewCerts(t)
	server, err := tls.LoadX509KeyPair(c.ServerCertFile, c.ServerKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(server.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"127.0.0.1", "::1", "localhost"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: c.CA}); err != nil {
			t.Errorf("server certificate for %s: %v", host, err)
		}
	}
	client, err := x509.ParseCertificate(c.Client.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Verify(x509.VerifyOptions{Roots: c.CA, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
}
