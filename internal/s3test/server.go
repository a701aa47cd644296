package s3test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// The store's one identity: every S3 action on every bucket.
const (
	Region    = "us-east-1"
	AccessKey = "RUNLEDGERTESTKEY"
	SecretKey = "runledger-test-secret-key"
)

// EnvWeed names the weed binary to run; without it, the newest
// bin/weed-* of the repository (make weed).
const EnvWeed = "RUNLEDGER_S3_WEED"

// ErrNoBinary is Binary's error when there is no weed binary: tests skip
// on it unless EnvRequire says otherwise.
var ErrNoBinary = errors.New("no SeaweedFS weed binary")

// Binary finds the weed binary: $RUNLEDGER_S3_WEED, else the newest
// bin/weed-* of the repository (make weed builds it there).
func Binary() (string, error) {
	if p := os.Getenv(EnvWeed); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: %s=%s: %w", ErrNoBinary, EnvWeed, p, err)
		}
		return p, nil
	}
	matches, _ := filepath.Glob(filepath.Join(repoRoot(), "bin", "weed-*"))
	var bins []string
	for _, m := range matches {
		if !strings.HasSuffix(m, ".tmp") {
			bins = append(bins, m)
		}
	}
	if len(bins) == 0 {
		return "", fmt.Errorf("%w: run make weed (make test builds it), or set %s", ErrNoBinary, EnvWeed)
	}
	sort.Slice(bins, func(i, j int) bool { return modTime(bins[i]).After(modTime(bins[j])) })
	return bins[0], nil
}

func modTime(p string) time.Time {
	fi, err := os.Stat(p)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// repoRoot is the repository's root directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Server is a running throwaway SeaweedFS (master, volume server, filer and
// S3 gateway in one weed process) owned by this process, on loopback. Its
// S3 gateway serves the same store twice: over plain HTTP (Endpoint) and
// over TLS (HTTPSEndpoint), with a certificate signed by a CA made for this
// server alone (CAPEM), which no other client trusts.
type Server struct {
	// Endpoint is the S3 API's base URL (http://127.0.0.1:PORT): path-style
	// addressing, Region, AccessKey and SecretKey.
	Endpoint string
	// HTTPSEndpoint is the same S3 API over TLS (https://127.0.0.1:PORT):
	// SeaweedFS' own HTTPS listener (weed server -s3.port.https), its
	// certificate for 127.0.0.1, ::1 and localhost, signed by CAPEM's CA.
	HTTPSEndpoint string
	// CAPEM is the PEM of the CA that signed HTTPSEndpoint's certificate,
	// generated when the server started: a client that trusts it (and
	// only it: TLSClient, CertPool) verifies the server; one that does
	// not, the system's roots for one, fails with x509's "certificate
	// signed by unknown authority".
	CAPEM []byte
	// CAFile is a file holding CAPEM, for what reads a CA from a path (a
	// Secret's file in a pod, an AWS_CA_BUNDLE); removed by Stop.
	CAFile string
	// Ready is how long the server took from its start to its first object
	// written and read back.
	Ready time.Duration

	dir     string
	ports   ports
	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error // how weed exited, once exited is closed
	logPath string
}

// ports are the weed process's listening ports, all on 127.0.0.1.
type ports struct {
	master, masterGRPC, volume, volumeGRPC, filer, filerGRPC, s3, s3GRPC, s3HTTPS int
}

// Start starts a server in a new temporary directory and waits until it
// stores and returns an object. The binary missing is ErrNoBinary.
func Start(ctx context.Context) (_ *Server, err error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "s3test-")
	if err != nil {
		return nil, fmt.Errorf("creating server directory: %w", err)
	}
	s := &Server{dir: dir, logPath: filepath.Join(dir, "weed.log")}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Stop())
		}
	}()
	if err := writeConfig(dir); err != nil {
		return nil, err
	}
	if s.CAPEM, err = writeTLS(dir); err != nil {
		return nil, err
	}
	s.CAFile = filepath.Join(dir, caFile)
	// Free ports are found by listening and closing: another process may
	// take one meanwhile, so a start that loses a port is tried again.
	for attempt := 1; ; attempt++ {
		err = s.start(ctx, bin)
		if err == nil {
			return s, nil
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
		if stopErr := s.shutdown(); stopErr != nil {
			return nil, errors.Join(err, stopErr)
		}
	}
}

// writeConfig writes the S3 identities and the master's settings into dir.
func writeConfig(dir string) error {
	identities, err := json.Marshal(map[string]any{"identities": []map[string]any{{
		"name":        "runledger-test",
		"credentials": []map[string]string{{"accessKey": AccessKey, "secretKey": SecretKey}},
		"actions":     []string{"Admin", "Read", "List", "Tagging", "Write"},
	}}})
	if err != nil {
		return fmt.Errorf("encoding the S3 identities: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "s3.json"), identities, 0o600); err != nil {
		return fmt.Errorf("writing the S3 identities: %w", err)
	}
	// Each bucket is a collection of its own, and the master grows a
	// collection 7 volumes at a time by default: one at a time keeps a
	// suite of many buckets within the volume server's slots.
	master := "[master.volume_growth]\ncopy_1 = 1\n"
	if err := os.WriteFile(filepath.Join(dir, "master.toml"), []byte(master), 0o600); err != nil {
		return fmt.Errorf("writing master.toml: %w", err)
	}
	return os.Mkdir(filepath.Join(dir, "data"), 0o700)
}

// freePorts are n distinct ports free on 127.0.0.1 a moment ago.
func freePorts(n int) ([]int, error) {
	// All held open until the last is found, so that they differ.
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	out := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// args are weed's arguments: every component on 127.0.0.1 and the ports
// given (the Iceberg and Lance catalogs off), no telemetry (its URL on
// loopback as well, should the switch ever be ignored), the logs on
// stderr, the configuration and the data in dir.
func (s *Server) args() []string {
	p, d := s.ports, s.dir
	port := func(name string, v int) string { return "-" + name + "=" + strconv.Itoa(v) }
	return []string{
		"-logtostderr", "-config_dir=" + d,
		"server", "-dir=" + filepath.Join(d, "data"), "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.telemetry=false", "-master.telemetry.url=http://127.0.0.1:1/",
		port("master.port", p.master), port("master.port.grpc", p.masterGRPC),
		"-master.volumeSizeLimitMB=1024",
		port("volume.port", p.volume), port("volume.port.grpc", p.volumeGRPC),
		"-volume.max=100", "-volume.preStopSeconds=0",
		"-filer", port("filer.port", p.filer), port("filer.port.grpc", p.filerGRPC),
		"-filer.localSocket=" + filepath.Join(d, "filer.sock"),
		"-s3", port("s3.port", p.s3), port("s3.port.grpc", p.s3GRPC),
		// HTTPS beside HTTP: the same gateway, a second listener.
		port("s3.port.https", p.s3HTTPS),
		"-s3.cert.file=" + filepath.Join(d, certFile), "-s3.key.file=" + filepath.Join(d, keyFile),
		"-s3.port.iceberg=0", "-s3.port.lance=0",
		"-s3.localSocket=" + filepath.Join(d, "s3.sock"),
		"-s3.config=" + filepath.Join(d, "s3.json"),
		"-s3.allowDeleteBucketNotEmpty",
	}
}

// start runs weed on new free ports and waits until it is ready.
func (s *Server) start(ctx context.Context, bin string) error {
	free, err := freePorts(9)
	if err != nil {
		return err
	}
	s.ports = ports{free[0], free[1], free[2], free[3], free[4], free[5], free[6], free[7], free[8]}
	s.Endpoint = "http://127.0.0.1:" + strconv.Itoa(s.ports.s3)
	s.HTTPSEndpoint = "https://127.0.0.1:" + strconv.Itoa(s.ports.s3HTTPS)
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("opening the server log: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, s.args()...)
	cmd.Dir = s.dir
	cmd.Env = append(os.Environ(), "HOME="+s.dir, "TMPDIR="+s.dir)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Pdeathsig: if this test binary dies without stopping the server, the
	// kernel kills it, so that no server outlives it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting weed: %w", err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	exited := s.exited
	go func() {
		if s.exitErr = cmd.Wait(); s.exitErr == nil {
			s.exitErr = errors.New("exit status 0")
		}
		close(exited)
	}()
	if err := s.waitReady(ctx, 90*time.Second); err != nil {
		return err
	}
	s.Ready = time.Since(began)
	return nil
}

// Client is an S3 client of the server: path-style, its endpoint, region
// and static credentials; opts change its options (another secret, no
// retries).
func (s *Server) Client(opts ...func(*s3.Options)) *s3.Client {
	return s3.New(s3.Options{
		BaseEndpoint: aws.String(s.Endpoint),
		Region:       Region,
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
	}, opts...)
}

// CertPool is a pool of CAPEM's CA alone: what a TLS client of
// HTTPSEndpoint trusts.
func (s *Server) CertPool() *x509.CertPool {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.CAPEM) {
		panic("s3test: no certificate in CAPEM")
	}
	return pool
}

// TLSClient is an S3 client of HTTPSEndpoint that trusts CAPEM's CA and no
// other (not the system's roots): path-style, region and static
// credentials as Client's; opts change its options.
func (s *Server) TLSClient(opts ...func(*s3.Options)) *s3.Client {
	pool := s.CertPool()
	httpClient := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	})
	return s3.New(s3.Options{
		BaseEndpoint: aws.String(s.HTTPSEndpoint),
		Region:       Region,
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
		HTTPClient:   httpClient,
	}, opts...)
}

// waitReady polls until a bucket can be made and an object written to it
// over HTTP and read back over HTTPS (the volume server registered and a
// volume grown, both listeners up), then removes them.
func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	once := func(o *s3.Options) { o.RetryMaxAttempts = 1 }
	client, tlsClient := s.Client(once), s.TLSClient(once)
	const bucket, key = "s3test-ready", "ready"
	var last error
	for {
		if last = s.probe(ctx, client, tlsClient, bucket, key); last == nil {
			break
		}
		select {
		case <-s.exited:
			return fmt.Errorf("weed exited during start-up (%w):\n%s", s.exitErr, s.LogTail())
		case <-ctx.Done():
			return fmt.Errorf("weed not ready after %s: %w\n%s", timeout, last, s.LogTail())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if _, err := client.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(bucket)}); err != nil {
		return fmt.Errorf("removing the readiness bucket: %w", err)
	}
	return nil
}

// probe makes bucket (again: an earlier probe may have made it), writes
// key with client and reads it back with tlsClient.
func (s *Server) probe(ctx context.Context, client, tlsClient *s3.Client, bucket, key string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := net.DialTimeout("tcp", strings.TrimPrefix(s.Endpoint, "http://"), time.Second); err != nil {
		return fmt.Errorf("connecting: %w", err)
	}
	if _, err := client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(bucket)}); err != nil {
		if _, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
			return fmt.Errorf("creating a bucket: %w", err)
		}
	}
	body := []byte("ready")
	if _, err := client.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(body)}); err != nil {
		return fmt.Errorf("writing an object: %w", err)
	}
	out, err := tlsClient.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		return fmt.Errorf("reading an object over HTTPS: %w", err)
	}
	defer out.Body.Close()
	var got bytes.Buffer
	if _, err := got.ReadFrom(out.Body); err != nil {
		return fmt.Errorf("reading an object: %w", err)
	}
	if !bytes.Equal(got.Bytes(), body) {
		return fmt.Errorf("read %q back, wrote %q", got.Bytes(), body)
	}
	return nil
}

// LogTail is the last lines of the server's log.
func (s *Server) LogTail() string {
	b, _ := os.ReadFile(s.logPath)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// PID is the weed process's ID.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Stop kills the server by its PID and removes its files.
func (s *Server) Stop() error {
	err := s.shutdown()
	if rmErr := os.RemoveAll(s.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("removing the server directory: %w", rmErr))
	}
	return err
}

// shutdown kills weed by its PID (SIGKILL) and removes the gRPC unix
// sockets it leaves under /tmp. Its data is thrown away, so it is not shut
// down gracefully: weed server's graceful stop takes 15-25 s (its filer
// flushes its metadata log to the volume server it has stopped already).
func (s *Server) shutdown() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	var err error
	if killErr := s.cmd.Process.Kill(); killErr != nil && !errors.Is(killErr, os.ErrProcessDone) {
		err = fmt.Errorf("killing weed (PID %d): %w", s.cmd.Process.Pid, killErr)
	}
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		return errors.Join(err, fmt.Errorf("weed (PID %d) still running 30s after SIGKILL", s.cmd.Process.Pid))
	}
	s.cmd = nil
	for _, sock := range s.sockets() {
		if fi, statErr := os.Lstat(sock); statErr == nil && fi.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(sock)
		}
	}
	return err
}

// sockets are the gRPC unix sockets weed makes under /tmp, named by its
// ports (it has no flag to put them elsewhere).
func (s *Server) sockets() []string {
	p := s.ports
	var out []string
	for name, port := range map[string]int{"master": p.masterGRPC, "volume": p.volumeGRPC, "filer": p.filerGRPC, "s3": p.s3GRPC} {
		out = append(out, fmt.Sprintf("/tmp/seaweedfs-%s-grpc-%d.sock", name, port))
	}
	return out
}

// Files are where the server keeps files: its directory and its sockets
// under /tmp. Stop removes them.
func (s *Server) Files() []string { return append([]string{s.dir}, s.sockets()...) }
