// Command pki writes the local cluster's certificates and kubeconfigs
// (hack/cluster.sh up): a CA, the control plane's serving and client
// certificates, a serving and a client certificate per node, the service
// account signing key, and a kubeconfig per client, all under -dir.
//
//	pki -dir /var/lib/runledger-cluster -apiserver-ip 10.250.0.2 \
//	    -service-ip 10.96.0.1 -node runledger=10.250.0.2 [-node NAME=IP]...
//
// Files: DIR/pki/{ca,apiserver,apiserver-kubelet-client,admin,
// controller-manager,scheduler,kube-proxy}.{crt,key}, DIR/pki/sa.{key,pub},
// DIR/pki/kubelet-NODE.{crt,key} (serving), DIR/pki/kubelet-client-NODE.{crt,key},
// and DIR/{admin,controller-manager,scheduler,kube-proxy,kubelet-NODE}.kubeconfig.
// With -postgres-ip, PostgreSQL's TLS gets a CA of its own, as a managed
// database's does: DIR/pki/postgres-ca.{crt,key} and its serving certificate
// DIR/pki/postgres.{crt,key} for that address. With -s3-ip, so does the
// object store's S3 gateway (SeaweedFS, HTTPS): DIR/pki/s3-ca.{crt,key} and
// DIR/pki/s3.{crt,key}.
package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// validity: a local cluster lives for hours; a year is what kubeadm gives leaf certificates.
const validity = 365 * 24 * time.Hour

// clusterName names the cluster, its user's context and the CA.
const clusterName = "runledger"

type nodeFlag []node

type node struct {
	name string
	ip   net.IP
}

func (n *nodeFlag) String() string { return fmt.Sprint(*n) }

func (n *nodeFlag) Set(v string) error {
	name, ip, ok := strings.Cut(v, "=")
	addr := net.ParseIP(ip)
	if !ok || name == "" || addr == nil {
		return fmt.Errorf("want NAME=IP, got %q", v)
	}
	*n = append(*n, node{name: name, ip: addr})
	return nil
}

type config struct {
	dir         string
	apiserverIP net.IP
	serviceIP   net.IP
	nodes       []node
	// postgresIP, when set, gets PostgreSQL's CA and serving certificate.
	postgresIP net.IP
	// s3IP, when set, gets the S3 gateway's CA and serving certificate.
	s3IP net.IP
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "pki:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("pki", flag.ContinueOnError)
	dir := fs.String("dir", "", "the cluster's state directory (required)")
	apiserverIP := fs.String("apiserver-ip", "", "the apiserver's address (required)")
	serviceIP := fs.String("service-ip", "", "the apiserver's ClusterIP (required)")
	var nodes nodeFlag
	fs.Var(&nodes, "node", "a node as NAME=IP (repeatable, at least one)")
	postgresIP := fs.String("postgres-ip", "", "PostgreSQL's address: a CA of its own and a serving certificate")
	s3IP := fs.String("s3-ip", "", "the S3 gateway's address: a CA of its own and a serving certificate")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := config{dir: *dir, apiserverIP: net.ParseIP(*apiserverIP), serviceIP: net.ParseIP(*serviceIP), nodes: nodes}
	for _, f := range []struct {
		name, value string
		ip          *net.IP
	}{{"postgres-ip", *postgresIP, &cfg.postgresIP}, {"s3-ip", *s3IP, &cfg.s3IP}} {
		if f.value == "" {
			continue
		}
		if *f.ip = net.ParseIP(f.value); *f.ip == nil {
			return fmt.Errorf("-%s: not an IP address: %q", f.name, f.value)
		}
	}
	if cfg.dir == "" || cfg.apiserverIP == nil || cfg.serviceIP == nil || len(cfg.nodes) == 0 || fs.NArg() > 0 {
		return errors.New("usage: pki -dir DIR -apiserver-ip IP -service-ip IP -node NAME=IP [-node NAME=IP]... [-postgres-ip IP] [-s3-ip IP]")
	}
	return generate(cfg)
}

// leaf is one certificate to sign and, for a client, the kubeconfig that carries it.
type leaf struct {
	file       string
	subject    pkix.Name
	server     bool
	dns        []string
	ips        []net.IP
	kubeconfig string // empty: no kubeconfig
}

func leaves(cfg config) []leaf {
	masters := []string{"system:masters"}
	ls := []leaf{
		{
			file: "apiserver", subject: pkix.Name{CommonName: "kube-apiserver"}, server: true,
			dns: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
			ips: []net.IP{cfg.serviceIP, cfg.apiserverIP, net.IPv4(127, 0, 0, 1)},
		},
		{file: "apiserver-kubelet-client", subject: pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: masters}},
		{file: "admin", subject: pkix.Name{CommonName: "runledger-admin", Organization: masters}, kubeconfig: "admin"},
		{file: "controller-manager", subject: pkix.Name{CommonName: "system:kube-controller-manager"}, kubeconfig: "controller-manager"},
		{file: "scheduler", subject: pkix.Name{CommonName: "system:kube-scheduler"}, kubeconfig: "scheduler"},
		{file: "kube-proxy", subject: pkix.Name{CommonName: "system:kube-proxy"}, kubeconfig: "kube-proxy"},
	}
	for _, n := range cfg.nodes {
		ls = append(ls,
			leaf{file: "kubelet-" + n.name, subject: pkix.Name{CommonName: n.name}, server: true, dns: []string{n.name}, ips: []net.IP{n.ip}},
			leaf{
				file:       "kubelet-client-" + n.name,
				subject:    pkix.Name{CommonName: "system:node:" + n.name, Organization: []string{"system:nodes"}},
				kubeconfig: "kubelet-" + n.name,
			})
	}
	return ls
}

func generate(cfg config) error {
	pki := filepath.Join(cfg.dir, "pki")
	if err := os.MkdirAll(pki, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", pki, err)
	}
	now := time.Now()
	ca, caKey, err := newCA(pki, "ca", clusterName+"-local-ca", now)
	if err != nil {
		return err
	}
	caDER := ca.Raw
	caPEM := pemBlock("CERTIFICATE", caDER)
	for _, l := range leaves(cfg) {
		der, key, err := sign(l, ca, caKey, now)
		if err != nil {
			return fmt.Errorf("%s: %w", l.file, err)
		}
		if err := writePair(pki, l.file, der, key); err != nil {
			return err
		}
		if l.kubeconfig == "" {
			continue
		}
		keyPEM, err := keyBlock(key)
		if err != nil {
			return fmt.Errorf("%s: %w", l.file, err)
		}
		kc := kubeconfig(fmt.Sprintf("https://%s:6443", cfg.apiserverIP), l.file, caPEM, pemBlock("CERTIFICATE", der), keyPEM)
		if err := os.WriteFile(filepath.Join(cfg.dir, l.kubeconfig+".kubeconfig"), kc, 0o600); err != nil {
			return fmt.Errorf("writing the kubeconfig %s: %w", l.kubeconfig, err)
		}
	}
	for _, own := range []struct {
		name string
		ip   net.IP
	}{{"postgres", cfg.postgresIP}, {"s3", cfg.s3IP}} {
		if own.ip == nil {
			continue
		}
		if err := ownCA(pki, own.name, own.ip, now); err != nil {
			return err
		}
	}
	// Service account tokens: RSA, as every client expects.
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generating the service account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(sa.Public())
	if err != nil {
		return fmt.Errorf("encoding the service account public key: %w", err)
	}
	saKey, err := keyBlock(sa)
	if err != nil {
		return fmt.Errorf("encoding the service account key: %w", err)
	}
	if err := os.WriteFile(filepath.Join(pki, "sa.key"), saKey, 0o600); err != nil {
		return fmt.Errorf("writing sa.key: %w", err)
	}
	if err := os.WriteFile(filepath.Join(pki, "sa.pub"), pemBlock("PUBLIC KEY", pub), 0o644); err != nil {
		return fmt.Errorf("writing sa.pub: %w", err)
	}
	return nil
}

// ownCA gives a server a CA of its own, as a managed service's is, and a
// serving certificate for ip signed by it: DIR/NAME-ca.{crt,key} and
// DIR/NAME.{crt,key}.
func ownCA(dir, name string, ip net.IP, now time.Time) error {
	ca, caKey, err := newCA(dir, name+"-ca", clusterName+"-"+name+"-ca", now)
	if err != nil {
		return err
	}
	l := leaf{file: name, subject: pkix.Name{CommonName: clusterName + "-" + name}, server: true, ips: []net.IP{ip}}
	der, key, err := sign(l, ca, caKey, now)
	if err != nil {
		return fmt.Errorf("%s: %w", l.file, err)
	}
	return writePair(dir, l.file, der, key)
}

// newCA creates a self-signed CA, written as DIR/NAME.{crt,key}.
func newCA(dir, name, commonName string, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating the key of %s: %w", name, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing %s: %w", name, err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing %s: %w", name, err)
	}
	if err := writePair(dir, name, der, key); err != nil {
		return nil, nil, err
	}
	return ca, key, nil
}

func sign(l leaf, ca *x509.Certificate, caKey crypto.Signer, now time.Time) ([]byte, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating the key: %w", err)
	}
	eku := x509.ExtKeyUsageClientAuth
	if l.server {
		eku = x509.ExtKeyUsageServerAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               l.subject,
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{eku},
		DNSNames:              l.dns,
		IPAddresses:           l.ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("signing: %w", err)
	}
	return der, key, nil
}

// serial: random, 128 bits, as RFC 5280 allows up to 20 octets.
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n
}

func writePair(dir, name string, der []byte, key crypto.Signer) error {
	keyPEM, err := keyBlock(key)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".key"), keyPEM, 0o600); err != nil {
		return fmt.Errorf("writing %s.key: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".crt"), pemBlock("CERTIFICATE", der), 0o644); err != nil {
		return fmt.Errorf("writing %s.crt: %w", name, err)
	}
	return nil
}

func keyBlock(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding the key: %w", err)
	}
	return pemBlock("PRIVATE KEY", der), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// kubeconfig: one cluster, one user, one context; the data inline, so the
// file is all a client needs.
func kubeconfig(server, user string, ca, cert, key []byte) []byte {
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: %[1]s
  cluster:
    server: %[2]s
    certificate-authority-data: %[3]s
users:
- name: %[4]s
  user:
    client-certificate-data: %[5]s
    client-key-data: %[6]s
contexts:
- name: %[1]s
  context:
    cluster: %[1]s
    user: %[4]s
current-context: %[1]s
`, clusterName, server, b64(ca), user, b64(cert), b64(key))
}
