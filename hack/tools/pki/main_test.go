package main

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestGenerate(t *testing.T) {
	dir := t.TempDir()
	err := run([]string{"-dir", dir, "-apiserver-ip", "10.250.0.2", "-service-ip", "10.96.0.1",
		"-node", "n1=10.250.0.2", "-node", "n2=10.250.1.2", "-postgres-ip", "10.250.0.2", "-s3-ip", "10.250.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(readCert(t, filepath.Join(dir, "pki", "ca.crt")))
	verify := func(name string, usage x509.ExtKeyUsage, host string) *x509.Certificate {
		t.Helper()
		c := readCert(t, filepath.Join(dir, "pki", name+".crt"))
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}, DNSName: host}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		return c
	}
	api := verify("apiserver", x509.ExtKeyUsageServerAuth, "kubernetes.default.svc")
	if err := api.VerifyHostname("10.96.0.1"); err != nil {
		t.Errorf("apiserver: %v", err)
	}
	if err := api.VerifyHostname("10.250.0.2"); err != nil {
		t.Errorf("apiserver: %v", err)
	}
	if err := verify("kubelet-n2", x509.ExtKeyUsageServerAuth, "n2").VerifyHostname("10.250.1.2"); err != nil {
		t.Errorf("kubelet-n2: %v", err)
	}
	if c := verify("kubelet-client-n1", x509.ExtKeyUsageClientAuth, ""); c.Subject.CommonName != "system:node:n1" ||
		strings.Join(c.Subject.Organization, ",") != "system:nodes" {
		t.Errorf("kubelet-client-n1 subject: %v", c.Subject)
	}
	if c := verify("admin", x509.ExtKeyUsageClientAuth, ""); strings.Join(c.Subject.Organization, ",") != "system:masters" {
		t.Errorf("admin subject: %v", c.Subject)
	}
	for _, kc := range []string{"admin", "controller-manager", "scheduler", "kube-proxy", "kubelet-n1", "kubelet-n2"} {
		path := filepath.Join(dir, kc+".kubeconfig")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", kc, st.Mode().Perm())
		}
		if !strings.Contains(string(b), "server: https://10.250.0.2:6443\n") {
			t.Errorf("%s: no server line:\n%s", kc, b)
		}
		// The embedded client certificate is the one signed for this client.
		m := regexp.MustCompile(`client-certificate-data: (\S+)`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s: no client certificate", kc)
		}
		der, _ := base64.StdEncoding.DecodeString(string(m[1]))
		blk, _ := pem.Decode(der)
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatalf("%s: %v", kc, err)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s: %v", kc, err)
		}
	}
	// PostgreSQL's and the S3 gateway's certificates verify against their
	// own CA only, as a managed service's do (sslmode=verify-full, or an S3
	// client, with the wrong CA fails), not against the cluster's nor each
	// other's.
	for _, name := range []string{"postgres", "s3"} {
		own := x509.NewCertPool()
		own.AddCert(readCert(t, filepath.Join(dir, "pki", name+"-ca.crt")))
		c := readCert(t, filepath.Join(dir, "pki", name+".crt"))
		if _, err := c.Verify(x509.VerifyOptions{Roots: own, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if err := c.VerifyHostname("10.250.0.2"); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool}); err == nil {
			t.Errorf("%s: verifies against the cluster's CA, want a CA of its own", name)
		}
	}
	pgPool := x509.NewCertPool()
	pgPool.AddCert(readCert(t, filepath.Join(dir, "pki", "postgres-ca.crt")))
	if _, err := readCert(t, filepath.Join(dir, "pki", "s3.crt")).Verify(x509.VerifyOptions{Roots: pgPool}); err == nil {
		t.Error("s3: verifies against PostgreSQL's CA, want a CA of its own")
	}
	for _, f := range []string{"sa.key", "sa.pub", "ca.key", "postgres-ca.key", "postgres.key", "s3-ca.key", "s3.key"} {
		if _, err := os.Stat(filepath.Join(dir, "pki", f)); err != nil {
			t.Error(err)
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-dir", "x", "-apiserver-ip", "10.0.0.1", "-service-ip", "10.96.0.1"},
		{"-dir", "x", "-apiserver-ip", "nope", "-service-ip", "10.96.0.1", "-node", "a=10.0.0.1"},
		{"-dir", "x", "-apiserver-ip", "10.0.0.1", "-service-ip", "10.96.0.1", "-node", "a"},
		{"-dir", "x", "-apiserver-ip", "10.0.0.1", "-service-ip", "10.96.0.1", "-node", "a=10.0.0.1", "-postgres-ip", "db"},
		{"-dir", "x", "-apiserver-ip", "10.0.0.1", "-service-ip", "10.96.0.1", "-node", "a=10.0.0.1", "-s3-ip", "s3"},
	} {
		if err := run(args); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
