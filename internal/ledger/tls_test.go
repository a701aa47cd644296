package ledger_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// selfSigned is a CA-less server certificate for 127.0.0.1 and its PEM.
func selfSigned(t *testing.T, name string) (tls.Certificate, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// tlsServer answers PostgreSQL's SSLRequest with 'S' and completes a real
// TLS handshake with cert; it never gets further than that.
func tlsServer(t *testing.T, cert tls.Certificate) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = conn.Close() }()
				req := make([]byte, 8)
				if _, err := io.ReadFull(conn, req); err != nil {
					return
				}
				if _, err := conn.Write([]byte{'S'}); err != nil {
					return
				}
				_ = tls.Server(conn, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}).Handshake()
			}()
		}
	}()
	return ln.Addr().String()
}

// TestConnectionRejected_UntrustedServerCertificate: a server whose TLS
// certificate the connection string's sslrootcert does not trust (the wrong
// CA) is a rejection that waiting cannot change: never retried, and said in
// words; pgx's real handshake produces the error.
func TestConnectionRejected_UntrustedServerCertificate(t *testing.T) {
	t.Parallel()
	serverCert, serverPEM := selfSigned(t, "the server")
	_, otherPEM := selfSigned(t, "another CA")
	addr := tlsServer(t, serverCert)
	host, port, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	connect := func(caPEM []byte) error {
		t.Helper()
		ca := filepath.Join(dir, fmt.Sprintf("ca-%d.crt", len(caPEM)))
		require.NoError(t, os.WriteFile(ca, caPEM, 0o600))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%s user=app password=s3cret dbname=app sslmode=verify-full sslrootcert=%s connect_timeout=5", host, port, ca))
		if err == nil {
			_ = conn.Close(ctx)
		}
		return err
	}

	err := connect(otherPEM)
	require.Error(t, err)
	why, rejected := ledger.ConnectionRejected(err)
	require.True(t, rejected, "a certificate the CA does not sign is a rejection: %v", err)
	require.Contains(t, why, "TLS certificate did not verify")
	require.False(t, ledger.IsRetryable(err), "not retried: %v", err)
	require.NotContains(t, err.Error(), "s3cret")

	// The right CA gets past the handshake (the server then hangs up: an
	// ordinary, retryable connection error).
	err = connect(serverPEM)
	require.Error(t, err)
	_, rejected = ledger.ConnectionRejected(err)
	require.False(t, rejected, "the right CA verifies: %v", err)
	require.True(t, ledger.IsRetryable(err), "%v", err)
}
