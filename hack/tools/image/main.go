// Command image builds and pushes container images from local static
// binaries, with no daemon: an empty base plus one layer holding the
// binaries (and /etc/passwd, /etc/group, /tmp), an entrypoint (the first
// binary), arguments, a numeric non-root user and labels; no shell. `build` writes an OCI image layout
// (an image index with one image per platform), `push` sends it to any OCI
// registry with the credentials of the usual docker config.
//
//	image build -o bin/image -binary linux/amd64=bin/platforms/linux_amd64/runledger,bin/platforms/linux_amd64/runledger-worker \
//	  -binary linux/arm64=bin/platforms/linux_arm64/runledger,bin/platforms/linux_arm64/runledger-worker -path /runledger \
//	  -label org.opencontainers.image.version=v0.1.0
//	image push bin/image registry.example/runledger:v0.1.0
//	image ref bin/image registry.example/runledger:v0.1.0   # registry.example/runledger@sha256:...
//
// The output is reproducible: the same binaries and flags give the same
// index digest (file times and the creation time are the Unix epoch, owners
// are root, compression is fixed).
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: image build|push|ref ARGS")
	}
	switch args[0] {
	case "build":
		return runBuild(args[1:], stdout)
	case "push":
		return runPush(ctx, args[1:], stdout)
	case "ref":
		return runRef(args[1:], stdout)
	}
	return fmt.Errorf("unknown command %q: want build, push or ref", args[0])
}

func runBuild(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("image build", flag.ContinueOnError)
	var (
		out      = fs.String("o", "", "output directory: an OCI image layout, replaced (required)")
		dst      = fs.String("path", "", "absolute path of the first binary in the image, also the entrypoint (default /<name of the binary>)")
		user     = fs.String("user", "65532:65532", "user[:group] the image runs as; numeric, so runAsNonRoot can verify it")
		binaries listFlag
		cmd      listFlag
		labels   listFlag
	)
	fs.Var(&binaries, "binary", "OS/ARCH=FILE[,FILE...]: the static binaries of one platform, the first the entrypoint (at -path), the others at /<name of the binary> (repeatable, one per platform)")
	fs.Var(&cmd, "arg", "a default argument, the image's Cmd (repeatable, in order)")
	fs.Var(&labels, "label", "KEY=VALUE: an image label, also an annotation of the index (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || len(binaries) == 0 || fs.NArg() > 0 {
		return errors.New("image build: -o and at least one -binary are required, and no positional arguments")
	}
	lbls := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("bad -label %q: want KEY=VALUE", l)
		}
		lbls[k] = v
	}
	spec := imageSpec{path: *dst, user: *user, cmd: cmd, labels: lbls}
	idx, err := buildIndex(binaries, spec)
	if err != nil {
		return err
	}
	if err := writeLayout(*out, idx); err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s %s\n", *out, d)
	return nil
}

// imageSpec is what every platform's image shares.
type imageSpec struct {
	path   string
	user   string
	cmd    []string
	labels map[string]string
}

// buildIndex returns an OCI image index with one image per
// OS/ARCH=FILE[,FILE...] of binaries.
func buildIndex(binaries []string, spec imageSpec) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	for _, b := range binaries {
		platform, list, ok := strings.Cut(b, "=")
		osName, arch, ok2 := strings.Cut(platform, "/")
		files := strings.Split(list, ",")
		if !ok || !ok2 || osName == "" || arch == "" || slices.Contains(files, "") {
			return nil, fmt.Errorf("bad -binary %q: want OS/ARCH=FILE[,FILE...]", b)
		}
		if seen[platform] {
			return nil, fmt.Errorf("-binary: platform %s given twice", platform)
		}
		seen[platform] = true
		img, err := buildImage(files, osName, arch, spec)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", platform, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: osName, Architecture: arch}},
		})
	}
	if len(spec.labels) > 0 {
		idx = mutate.Annotations(idx, spec.labels).(v1.ImageIndex)
	}
	return idx, nil
}

func buildImage(bins []string, osName, arch string, spec imageSpec) (v1.Image, error) {
	dst := spec.path
	if dst == "" {
		dst = "/" + filepath.Base(bins[0])
	}
	specs := []string{bins[0] + "=" + dst}
	for _, b := range bins[1:] {
		specs = append(specs, b+"=/"+filepath.Base(b))
	}
	layerTar, dsts, err := buildLayer(specs)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer: layer,
		// Destination paths only: the source paths are local and would make
		// the digest depend on where the repository is checked out.
		History: v1.History{
			Created:   v1.Time{Time: time.Unix(0, 0).UTC()},
			CreatedBy: "hack/tools/image " + strings.Join(dsts, " "),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS = osName
	cf.Architecture = arch
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config.Entrypoint = []string{dsts[0]}
	cf.Config.Cmd = spec.cmd
	cf.Config.User = spec.user
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	cf.Config.Labels = spec.labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return img, nil
}

// writeLayout writes idx as an OCI image layout in dir, through a sibling
// directory renamed into place: an interrupted build never leaves a layout
// that looks complete.
func writeLayout(dir string, idx v1.ImageIndex) error {
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	p, err := layout.Write(tmp, mutate.IndexMediaType(empty.Index, types.OCIImageIndex))
	if err != nil {
		return fmt.Errorf("write layout %s: %w", dir, err)
	}
	if err := p.AppendIndex(idx); err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("write layout %s: %w", dir, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// readLayout returns the one image index of the layout in dir.
func readLayout(dir string) (v1.ImageIndex, error) {
	outer, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("read layout %s (run image build first): %w", dir, err)
	}
	m, err := outer.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(m.Manifests) != 1 {
		return nil, fmt.Errorf("layout %s holds %d manifests, want one image index", dir, len(m.Manifests))
	}
	return outer.ImageIndex(m.Manifests[0].Digest)
}

func runPush(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("image push", flag.ContinueOnError)
	insecure := fs.Bool("insecure", false, "allow a registry over plain HTTP (a local one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return errors.New("usage: image push [-insecure] LAYOUT_DIR REGISTRY/REPOSITORY:TAG")
	}
	var opts []name.Option
	if *insecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.NewTag(fs.Arg(1), opts...)
	if err != nil {
		return fmt.Errorf("bad image reference %q (want REGISTRY/REPOSITORY:TAG): %w", fs.Arg(1), err)
	}
	idx, err := readLayout(fs.Arg(0))
	if err != nil {
		return err
	}
	if err := remote.WriteIndex(ref, idx, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	// What a manifest pins: the repository and the digest.
	fmt.Fprintf(stdout, "%s@%s\n", ref.Context().Name(), d)
	return nil
}

// buildLayer returns an uncompressed tar of the files (SRC=DST pairs), with
// their parent directories, /tmp (mode 1777) and a minimal /etc/passwd and
// /etc/group naming the conventional nonroot user 65532, in a stable order
// with fixed times and root ownership.
func buildLayer(specs []string) (layer []byte, dsts []string, err error) {
	type entry struct {
		src  string // "" for a directory or generated content
		data []byte // generated content
		mode int64
		dir  bool
	}
	entries := map[string]entry{
		"tmp":        {mode: 0o1777, dir: true},
		"etc":        {mode: 0o755, dir: true},
		"etc/passwd": {data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"), mode: 0o644},
		"etc/group":  {data: []byte("root:x:0:\nnonroot:x:65532:\n"), mode: 0o644},
	}
	for _, spec := range specs {
		src, dst, ok := strings.Cut(spec, "=")
		if !ok || src == "" || !strings.HasPrefix(dst, "/") {
			return nil, nil, fmt.Errorf("bad file %q: want SRC=/ABSOLUTE/DST", spec)
		}
		dst = strings.TrimPrefix(path.Clean(dst), "/")
		if dst == "" {
			return nil, nil, fmt.Errorf("bad file %q: DST is the root directory", spec)
		}
		if _, taken := entries[dst]; taken {
			return nil, nil, fmt.Errorf("two files at /%s: give each binary its own name or -path", dst)
		}
		st, err := os.Stat(src)
		if err != nil {
			return nil, nil, err
		}
		if !st.Mode().IsRegular() {
			return nil, nil, fmt.Errorf("%s: not a regular file", src)
		}
		mode := int64(0o644)
		if st.Mode()&0o111 != 0 {
			mode = 0o755
		}
		entries[dst] = entry{src: src, mode: mode}
		dsts = append(dsts, "/"+dst)
		for d := path.Dir(dst); d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = entry{mode: 0o755, dir: true}
			}
		}
	}

	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names) // parents sort before their children

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, n := range names {
		e := entries[n]
		hdr := &tar.Header{Name: n, Mode: e.mode, ModTime: epoch}
		var body io.Reader
		switch {
		case e.dir:
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
		case e.src != "":
			f, err := os.Open(e.src)
			if err != nil {
				return nil, nil, err
			}
			defer f.Close() //nolint:errcheck // read-only
			st, err := f.Stat()
			if err != nil {
				return nil, nil, err
			}
			hdr.Typeflag, hdr.Size, body = tar.TypeReg, st.Size(), f
		default:
			hdr.Typeflag, hdr.Size, body = tar.TypeReg, int64(len(e.data)), bytes.NewReader(e.data)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, nil, err
		}
		if body != nil {
			if _, err := io.Copy(tw, body); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", n, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, nil, err
	}
	return buf.Bytes(), dsts, nil
}

// runRef prints the reference by digest that a manifest pins: the
// repository of IMAGE (its tag dropped) and the digest of the layout's
// index, which push keeps.
func runRef(args []string, stdout io.Writer) error {
	if len(args) != 2 {
		return errors.New("usage: image ref LAYOUT_DIR REGISTRY/REPOSITORY[:TAG]")
	}
	ref, err := name.ParseReference(args[1])
	if err != nil {
		return fmt.Errorf("bad image reference %q (want REGISTRY/REPOSITORY[:TAG]): %w", args[1], err)
	}
	idx, err := readLayout(args[0])
	if err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s@%s\n", ref.Context().Name(), d)
	return nil
}
