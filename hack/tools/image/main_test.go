package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// fakeBinaries writes two "static binaries" (their bytes only matter), and
// a second one for each platform, runledger-worker, beside it.
func fakeBinaries(t *testing.T) (amd64, arm64 string) {
	t.Helper()
	dir := t.TempDir()
	amd64, arm64 = filepath.Join(dir, "amd64", "runledger"), filepath.Join(dir, "arm64", "runledger")
	for _, f := range []string{amd64, arm64} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"runledger", "runledger-worker"} {
			if err := os.WriteFile(filepath.Join(filepath.Dir(f), name), []byte("binary for "+filepath.Base(filepath.Dir(f))+"/"+name), 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	return amd64, arm64
}

func build(t *testing.T, out string, extra ...string) string {
	t.Helper()
	amd64, arm64 := fakeBinaries(t)
	var stdout bytes.Buffer
	worker := func(bin string) string { return "," + filepath.Join(filepath.Dir(bin), "runledger-worker") }
	args := append([]string{"build", "-o", out, "-binary", "linux/amd64=" + amd64 + worker(amd64), "-binary", "linux/arm64=" + arm64 + worker(arm64),
		"-path", "/runledger", "-label", "org.opencontainers.image.version=v1.2.3"}, extra...)
	if err := run(context.Background(), args, &stdout); err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(stdout.String())
	if len(f) != 2 || f[0] != out || !strings.HasPrefix(f[1], "sha256:") {
		t.Fatalf("build printed %q, want the layout and its digest", stdout.String())
	}
	return f[1]
}

// Same binaries and flags, built twice in other places at other times: the
// same digest. A changed label is a new digest.
func TestBuildIsReproducible(t *testing.T) {
	a := build(t, filepath.Join(t.TempDir(), "one"))
	b := build(t, filepath.Join(t.TempDir(), "two", "image"))
	if a != b {
		t.Fatalf("two builds of the same inputs: %s and %s", a, b)
	}
	if c := build(t, filepath.Join(t.TempDir(), "three"), "-label", "org.opencontainers.image.revision=abc"); c == a {
		t.Fatal("a new label left the digest unchanged")
	}
}

// Each platform's image: its own binaries, the first the entrypoint, a
// numeric non-root user, the labels, no shell (the layer holds the
// binaries, /etc/passwd, /etc/group and /tmp, nothing else).
func TestBuildContents(t *testing.T) {
	out := filepath.Join(t.TempDir(), "image")
	build(t, out, "-label", "org.opencontainers.image.source=https://example.com/runledger")
	idx, err := readLayout(out)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != "application/vnd.oci.image.index.v1+json" || m.Annotations["org.opencontainers.image.version"] != "v1.2.3" {
		t.Fatalf("index: media type %s, annotations %v", m.MediaType, m.Annotations)
	}
	var archs []string
	for _, d := range m.Manifests {
		archs = append(archs, d.Platform.OS+"/"+d.Platform.Architecture)
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Architecture != d.Platform.Architecture || cf.OS != "linux" {
			t.Errorf("%s: config says %s/%s", d.Platform.Architecture, cf.OS, cf.Architecture)
		}
		if cf.Config.User != "65532:65532" || strings.Join(cf.Config.Entrypoint, " ") != "/runledger" {
			t.Errorf("%s: user %q entrypoint %q", d.Platform.Architecture, cf.Config.User, cf.Config.Entrypoint)
		}
		for k, v := range map[string]string{"org.opencontainers.image.version": "v1.2.3", "org.opencontainers.image.source": "https://example.com/runledger"} {
			if cf.Config.Labels[k] != v {
				t.Errorf("%s: label %s = %q, want %q", d.Platform.Architecture, k, cf.Config.Labels[k], v)
			}
		}
		files := layerFiles(t, img)
		if want := "etc/ etc/group etc/passwd runledger runledger-worker tmp/"; strings.Join(files.names, " ") != want {
			t.Errorf("%s: layer holds %v, want %s (no shell)", d.Platform.Architecture, files.names, want)
		}
		for _, name := range []string{"runledger", "runledger-worker"} {
			if !strings.HasSuffix(files.content[name], d.Platform.Architecture+"/"+name) {
				t.Errorf("%s: /%s is %q, another binary", d.Platform.Architecture, name, files.content[name])
			}
		}
	}
	if strings.Join(archs, " ") != "linux/amd64 linux/arm64" {
		t.Fatalf("platforms %v", archs)
	}
}

type files struct {
	names   []string
	content map[string]string
}

func layerFiles(t *testing.T, img v1.Image) files {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close() //nolint:errcheck // read-only
	fs := files{content: map[string]string{}}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return fs
		}
		if err != nil {
			t.Fatal(err)
		}
		fs.names = append(fs.names, h.Name)
		b, _ := io.ReadAll(tr)
		fs.content[h.Name] = string(b)
	}
}

// push sends the layout to a registry with the credentials of the docker
// config ($DOCKER_CONFIG/config.json), and prints REPOSITORY@DIGEST: the
// digest the registry serves for the tag.
func TestPush(t *testing.T) {
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "pusher" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	out := filepath.Join(t.TempDir(), "image")
	digest := build(t, out)
	ref := host + "/team/runledger:v1.2.3"

	dockerConfig := t.TempDir()
	t.Setenv("DOCKER_CONFIG", dockerConfig)
	var stdout bytes.Buffer
	err := run(context.Background(), []string{"push", "-insecure", out, ref}, &stdout)
	if err == nil || !strings.Contains(err.Error(), "push "+ref) {
		t.Fatalf("push without credentials: %v", err)
	}

	auth := base64.StdEncoding.EncodeToString([]byte("pusher:s3cret"))
	if err := os.WriteFile(filepath.Join(dockerConfig, "config.json"),
		[]byte(`{"auths":{"`+host+`":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"push", "-insecure", out, ref}, &stdout); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(stdout.String()), host+"/team/runledger@"+digest; got != want {
		t.Fatalf("push printed %q, want %q", got, want)
	}
	// ref names the same image before any push: what the installer pins.
	stdout.Reset()
	if err := run(context.Background(), []string{"ref", out, host + "/team/runledger:other-tag"}, &stdout); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(stdout.String()), host+"/team/runledger@"+digest; got != want {
		t.Fatalf("ref printed %q, want %q", got, want)
	}
	tag, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Head(tag, remote.WithAuth(&authn.Basic{Username: "pusher", Password: "s3cret"}))
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest.String() != digest {
		t.Fatalf("the registry serves %s for the tag, want %s", desc.Digest, digest)
	}
}

func TestBadInput(t *testing.T) {
	amd64, _ := fakeBinaries(t)
	out := filepath.Join(t.TempDir(), "image")
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{}, "usage: image build|push|ref"},
		{[]string{"ref", out}, "usage: image ref"},
		{[]string{"ref", out, "Not A Reference"}, "bad image reference"},
		{[]string{"ref", filepath.Join(t.TempDir(), "none"), "registry.example/r:t"}, "run image build first"},
		{[]string{"tag"}, `unknown command "tag"`},
		{[]string{"build", "-o", out}, "-o and at least one -binary are required"},
		{[]string{"build", "-o", out, "-binary", amd64}, "want OS/ARCH=FILE[,FILE...]"},
		{[]string{"build", "-o", out, "-binary", "linux/amd64=" + amd64 + ","}, "want OS/ARCH=FILE[,FILE...]"},
		{[]string{"build", "-o", out, "-binary", "linux/amd64=" + amd64 + "," + amd64}, "two files at /runledger"},
		{[]string{"build", "-o", out, "-binary", "linux/amd64=" + amd64, "-binary", "linux/amd64=" + amd64}, "platform linux/amd64 given twice"},
		{[]string{"build", "-o", out, "-binary", "linux/amd64=/no/such/file"}, "no such file"},
		{[]string{"build", "-o", out, "-binary", "linux/amd64=" + amd64, "-label", "novalue"}, `bad -label "novalue"`},
		{[]string{"push", out}, "usage: image push"},
		{[]string{"push", out, "Not A Reference"}, "bad image reference"},
		{[]string{"push", filepath.Join(t.TempDir(), "none"), "registry.example/r:t"}, "run image build first"},
	} {
		err := run(context.Background(), tt.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want it to say %q", tt.args, err, tt.want)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a failed build left %s behind", out)
	}
}
