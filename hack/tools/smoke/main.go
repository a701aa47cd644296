// Command smoke holds the probes hack/cluster.sh smoke runs in pods:
//
//	smoke hello      print a line and exit 0 (a locally built image runs)
//	smoke apiserver  GET https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version
//	                 with the pod's service account token and CA, as in-cluster
//	                 client-go does (the ClusterIP works: kube-proxy is up)
//	smoke postgres   connect to $DATABASE_URL and run a query (PostgreSQL is
//	                 reachable from pods, password authentication works)
//	smoke dial ADDR  after 3 s, open a TCP connection to ADDR (host:port)
//	                 within 5 s (what a NetworkPolicy allows, or refuses)
//	smoke https URL CAFILE
//	                 after 3 s (as dial), GET URL over TLS verified against CAFILE's CA alone (not
//	                 the system's roots), print the status and the body (at
//	                 most 4 KiB); success is a 200 (a presigned S3 URL of an
//	                 object: the object store is reachable, its certificate
//	                 verified, the object read); the connection within 5 s
//
// Each prints what it saw and exits 0 on success, 1 on failure.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	if len(os.Args) != 2 && (len(os.Args) != 3 || os.Args[1] != "dial") && (len(os.Args) != 4 || os.Args[1] != "https") {
		fmt.Fprintln(os.Stderr, "usage: smoke hello|apiserver|postgres|dial ADDR|https URL CAFILE")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	switch os.Args[1] {
	case "hello":
		host, _ := os.Hostname()
		fmt.Printf("hello from %s (uid %d)\n", host, os.Getuid())
	case "apiserver":
		err = apiserver(ctx)
	case "postgres":
		err = postgres(ctx)
	case "dial":
		err = dial(ctx, os.Args[2])
	case "https":
		err = httpsGet(ctx, os.Args[2], os.Args[3])
	default:
		err = fmt.Errorf("unknown probe %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "smoke:", err)
		os.Exit(1)
	}
}

func apiserver(ctx context.Context) error {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return fmt.Errorf("KUBERNETES_SERVICE_HOST/PORT not set")
	}
	token, err := os.ReadFile(saDir + "/token")
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("no certificate in %s/ca.crt", saDir)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	url := "https://" + net.JoinHostPort(host, port) + "/version"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+string(token))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close() //nolint:errcheck // read-only
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	fmt.Printf("GET %s: %s\n%s\n", url, resp.Status, body)
	return nil
}

func postgres(ctx context.Context) error {
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		return fmt.Errorf("DATABASE_URL not set")
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err // pgx redacts the password in its errors
	}
	defer conn.Close(ctx) //nolint:errcheck // best effort
	var user, addr, version string
	if err := conn.QueryRow(ctx,
		`SELECT current_user, coalesce(inet_server_addr()::text, 'socket'), version()`).Scan(&user, &addr, &version); err != nil {
		return err
	}
	fmt.Printf("connected to PostgreSQL at %s as %s: %s\n", addr, user, version)
	return nil
}

func dial(ctx context.Context, addr string) error {
	// A node's NetworkPolicy agent learns a new pod's address from the API
	// server, which the pod's first packets can beat (kubernetes#85966).
	time.Sleep(3 * time.Second)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	fmt.Printf("connected to %s from %s\n", addr, conn.LocalAddr())
	return conn.Close()
}

func httpsGet(ctx context.Context, url, caFile string) error {
	time.Sleep(3 * time.Second) // as dial's, for the NetworkPolicy agent
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("no certificate in %s", caFile)
	}
	client := &http.Client{Transport: &http.Transport{
		DialContext:     (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	// The URL without its query (a presigned URL's signature), in what is printed.
	where := req.URL.Scheme + "://" + req.URL.Host + req.URL.Path
	resp, err := client.Do(req)
	if err != nil {
		var ue *neturl.Error
		if errors.As(err, &ue) {
			ue.URL = where
		}
		return err
	}
	defer resp.Body.Close() //nolint:errcheck // read-only
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if err != nil {
		return err
	}
	fmt.Printf("GET %s (TLS %s, verified against %s): %s\n%s\n", where, tls.VersionName(resp.TLS.Version), caFile, resp.Status, body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET: %s", resp.Status)
	}
	return nil
}
