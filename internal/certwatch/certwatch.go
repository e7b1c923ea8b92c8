// Package certwatch serves a TLS certificate and key read from files, and
// reads them again when they change, so that a rotated certificate (a
// Kubernetes Secret update, cert-manager's renewal) is served without a
// restart. Connections already open keep the certificate of their
// handshake: only new handshakes see the new one, so calls in flight are
// never dropped.
package certwatch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Cert is a certificate and key pair read from files. Its GetCertificate
// goes in a tls.Config; Reload or Watch read the files again.
type Cert struct {
	certFile, keyFile string
	log               *slog.Logger
	mu                sync.Mutex // serializes Reload
	sum               [sha256.Size]byte
	cur               atomic.Pointer[tls.Certificate]
}

// Load reads the pair from certFile and keyFile (PEM), or returns an
// error naming the files. log receives Watch's lines; nil is
// slog.Default().
func Load(certFile, keyFile string, log *slog.Logger) (*Cert, error) {
	if log == nil {
		log = slog.Default()
	}
	c := &Cert{certFile: certFile, keyFile: keyFile, log: log}
	if _, err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// GetCertificate returns the pair in force, for tls.Config.GetCertificate.
func (c *Cert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.cur.Load(), nil
}

// Certificate returns the pair in force.
func (c *Cert) Certificate() *tls.Certificate { return c.cur.Load() }

// Reload reads the files again and, when their content changed and is a
// valid pair, puts it in force. changed is false when the files hold what
// is in force. On an error (a file missing, half written, or a key that
// does not match the certificate, as between the writes of a rotation
// that is not atomic) the pair in force stays.
func (c *Cert) Reload() (changed bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	certPEM, err := os.ReadFile(c.certFile)
	if err != nil {
		return false, fmt.Errorf("tls certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(c.keyFile)
	if err != nil {
		return false, fmt.Errorf("tls key: %w", err)
	}
	sum := sha256.Sum256(bytes.Join([][]byte{certPEM, keyPEM}, []byte{0}))
	if c.cur.Load() != nil && sum == c.sum {
		return false, nil
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false, fmt.Errorf("tls certificate %s and key %s: %w", c.certFile, c.keyFile, err)
	}
	c.cur.Store(&pair)
	c.sum = sum
	return true, nil
}

// Watch calls Reload every interval until ctx ends, logging each new
// certificate (its serial number and expiry) and each failure; a failure
// is logged once until the files change again.
func (c *Cert) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var failed string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		changed, err := c.Reload()
		switch {
		case err != nil:
			if err.Error() != failed {
				failed = err.Error()
				c.log.Warn("TLS certificate not reloaded; the one in force stays", "error", failed)
			}
		case changed:
			failed = ""
			leaf := c.Certificate().Leaf
			c.log.Info("TLS certificate reloaded", "file", c.certFile, "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter)
		}
	}
}
