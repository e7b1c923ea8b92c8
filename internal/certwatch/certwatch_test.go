package certwatch

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writePair writes a self-signed certificate of the given serial and its
// key to dir's cert.pem and key.pem, each by rename (as a Secret volume
// update swaps them), and returns the key's PEM.
func writePair(t *testing.T, dir string, serial int64) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "certwatch test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	writeFile(t, filepath.Join(dir, "cert.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	writeFile(t, filepath.Join(dir, "key.pem"), keyPEM)
	return keyPEM
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func serial(t *testing.T, c *Cert) int64 {
	t.Helper()
	got, err := c.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	return got.Leaf.SerialNumber.Int64()
}

func TestReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writePair(t, dir, 1)
	c, err := Load(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := serial(t, c); s != 1 {
		t.Fatalf("serial %d, want 1", s)
	}
	if changed, err := c.Reload(); changed || err != nil {
		t.Errorf("Reload of unchanged files: %v %v, want false, nil", changed, err)
	}
	key2 := writePair(t, dir, 2)
	if changed, err := c.Reload(); !changed || err != nil || serial(t, c) != 2 {
		t.Fatalf("Reload after a rotation: %v %v serial %d, want true, nil, 2", changed, err, serial(t, c))
	}
	// Halfway through a rotation that is not atomic: a new certificate
	// with the old key. The pair in force stays.
	writePair(t, dir, 3)
	writeFile(t, keyFile, key2)
	if changed, err := c.Reload(); changed || err == nil || !strings.Contains(err.Error(), "cert.pem") || serial(t, c) != 2 {
		t.Errorf("Reload of a mismatched pair: %v %v serial %d, want an error naming the file and serial 2", changed, err, serial(t, c))
	}
	if err := os.Remove(certFile); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reload(); err == nil || serial(t, c) != 2 {
		t.Errorf("Reload of a missing file: %v serial %d, want an error and serial 2", err, serial(t, c))
	}
	if _, err := Load(certFile, keyFile, nil); err == nil {
		t.Error("Load of a missing file: no error")
	}
}

func TestWatch(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writePair(t, dir, 1)
	c, err := Load(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Watch(ctx, time.Millisecond); close(done) }()
	writePair(t, dir, 7)
	// A bound on a hung test only: the watcher looks every millisecond.
	for deadline := time.Now().Add(30 * time.Second); serial(t, c) != 7; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the rotated certificate was not loaded")
		}
	}
	cancel()
	<-done
}
