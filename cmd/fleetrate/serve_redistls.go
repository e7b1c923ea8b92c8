package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/fleetrate/fleetrate/internal/config"
)

// redisTLSFiles say whom a rediss:// connection trusts and how it proves
// itself, as envoyproxy/ratelimit's REDIS_TLS_CACERT,
// REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY and
// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION do.
type redisTLSFiles struct {
	caFile, certFile, keyFile string
	skipHostname              bool
}

func (f redisTLSFiles) set() bool {
	return f.caFile != "" || f.certFile != "" || f.keyFile != "" || f.skipHostname
}

// addRedisTLSFlags adds the flags of redisTLSFiles.
func addRedisTLSFlags(fs *pflag.FlagSet) {
	fs.String("redis-tls-ca-file", "", "with a rediss:// URL, also trust these CAs (PEM) for Redis's certificate, beside the system's (REDIS_TLS_CACERT)")
	fs.String("redis-tls-cert-file", "", "with a rediss:// URL, present this client certificate (PEM) to Redis; needs --redis-tls-key-file (REDIS_TLS_CLIENT_CERT)")
	fs.String("redis-tls-key-file", "", "the key (PEM) of --redis-tls-cert-file (REDIS_TLS_CLIENT_KEY)")
	fs.Bool("redis-tls-skip-hostname-verification", false, "with a rediss:// URL, verify Redis's certificate chain but not that it names the host dialled (REDIS_TLS_SKIP_HOSTNAME_VERIFICATION)")
}

// redisTLS resolves redisTLSFiles, with s the file's server section.
func (r *resolver) redisTLS(s config.Settings) redisTLSFiles {
	return redisTLSFiles{
		caFile:       r.str("redis-tls-ca-file", s.RedisTLSCAFile),
		certFile:     r.str("redis-tls-cert-file", s.RedisTLSCertFile),
		keyFile:      r.str("redis-tls-key-file", s.RedisTLSKeyFile),
		skipHostname: r.boolean("redis-tls-skip-hostname-verification", s.RedisTLSSkipHostname),
	}
}

// apply returns c, the TLS configuration a Redis URL gave (nil for one
// without TLS), with the files' CAs, client certificate and hostname
// check. Files given for a URL without TLS are an error: they would not
// be used, while the operator believes Redis is reached over TLS.
func (f redisTLSFiles) apply(c *tls.Config) (*tls.Config, error) {
	if !f.set() {
		return c, nil
	}
	if c == nil {
		return nil, errors.New("--redis-tls-* (REDIS_TLS_*) need a rediss:// URL (REDIS_TLS=true): the Redis URL is not TLS")
	}
	c = c.Clone()
	if f.caFile != "" {
		pem, err := os.ReadFile(f.caFile)
		if err != nil {
			return nil, fmt.Errorf("--redis-tls-ca-file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--redis-tls-ca-file %s: no PEM certificate found", f.caFile)
		}
		c.RootCAs = pool
	}
	if (f.certFile == "") != (f.keyFile == "") {
		return nil, errors.New("give both --redis-tls-cert-file and --redis-tls-key-file (REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY), or neither")
	}
	if f.certFile != "" {
		pair, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--redis-tls-cert-file and --redis-tls-key-file: %w", err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	if f.skipHostname {
		// Go's check is off so that the chain is checked here, without
		// the host name.
		roots := c.RootCAs
		c.InsecureSkipVerify = true
		c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			return verifyChain(raw, roots)
		}
	}
	return c, nil
}

// verifyChain verifies a peer's certificates (leaf first) against roots
// (the system's when nil), without a host name.
func verifyChain(raw [][]byte, roots *x509.CertPool) error {
	if len(raw) == 0 {
		return errors.New("tls: Redis sent no certificate")
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
	var leaf *x509.Certificate
	for i, der := range raw {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("tls: Redis's certificate: %w", err)
		}
		if i == 0 {
			leaf = cert
		} else {
			opts.Intermediates.AddCert(cert)
		}
	}
	_, err := leaf.Verify(opts)
	return err
}
