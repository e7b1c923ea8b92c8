package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fleetrate/fleetrate/internal/certwatch"
)

// loadTLS returns the TLS configuration of st, nil without a certificate.
// The certificate and key are read again when they change (every
// --reload-interval, and on SIGHUP) until ctx ends, as
// envoyproxy/ratelimit reloads GRPC_SERVER_TLS_CERT: new handshakes get
// the new pair, connections open keep theirs. With --tls-client-ca-file a
// client must show a certificate from those CAs, and with
// --tls-client-san one that names it.
func loadTLS(ctx context.Context, st serveSettings, log *slog.Logger) (*tls.Config, error) {
	if st.tlsCertFile == "" {
		return nil, nil
	}
	cert, err := certwatch.Load(st.tlsCertFile, st.tlsKeyFile, log)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert-file, --tls-key-file: %w", err)
	}
	c := &tls.Config{GetCertificate: cert.GetCertificate, MinVersion: tls.VersionTLS12}
	if st.tlsClientCAFile != "" {
		pem, err := os.ReadFile(st.tlsClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls client CA %s: no PEM certificate found", st.tlsClientCAFile)
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
		if san := st.envoyCompat.tlsClientSAN; san != "" {
			c.VerifyPeerCertificate = verifyClientSAN(san)
		}
	}
	go watchCert(ctx, cert, st.reloadInterval, log)
	return c, nil
}

// watchCert reloads cert every interval (never when 0) and on each
// SIGHUP, until ctx ends.
func watchCert(ctx context.Context, cert *certwatch.Cert, interval time.Duration, log *slog.Logger) {
	if interval > 0 {
		go cert.Watch(ctx, interval)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if changed, err := cert.Reload(); err != nil {
			log.Warn("SIGHUP: TLS certificate not reloaded; the one in force stays", "error", err.Error())
		} else if changed {
			log.Info("SIGHUP: TLS certificate reloaded", "serial", cert.Certificate().Leaf.SerialNumber.String())
		}
	}
}

// verifyClientSAN refuses, after the usual verification against the
// client CAs, a client certificate that does not name san (a DNS name,
// wildcards as in x509.Certificate.VerifyHostname, or an IP address), as
// envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN does.
func verifyClientSAN(san string) func([][]byte, [][]*x509.Certificate) error {
	return func(_ [][]byte, chains [][]*x509.Certificate) error {
		if len(chains) == 0 || len(chains[0]) == 0 {
			return errors.New("tls: no verified client certificate")
		}
		if err := chains[0][0].VerifyHostname(san); err != nil {
			return fmt.Errorf("tls: client certificate refused by --tls-client-san %q: %w", san, err)
		}
		return nil
	}
}

// listenUnix listens on a Unix socket at path. A socket file that no
// process answers on (left by one that died) is removed first; one that
// answers is an error.
func listenUnix(path string) (net.Listener, error) {
	if path == "" {
		return nil, errors.New("unix: the socket's path is empty")
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("unix socket %s: another process serves on it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("unix socket %s: %w", path, err)
		}
	}
	return net.Listen("unix", path)
}
