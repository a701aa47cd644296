// Command image writes a container image tarball from local files: an empty
// base plus one layer holding the given files (typically one static
// CGO_ENABLED=0 binary), with an entrypoint, arguments and user, tagged with a
// local name. The tarball is in the `docker save` format, which
// `ctr -n k8s.io images import` understands, so the local cluster
// (hack/cluster.sh) needs neither a registry nor Docker.
//
//	image -tag runledger.local/runledger:dev -o bin/images/runledger.tar \
//	  -file bin/runledger=/runledger -entrypoint /runledger -user 65532:65532
//
// The output is reproducible: the same inputs give the same image digest
// (file times and the creation time are the Unix epoch, owners are root).
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	var (
		tag        = fs.String("tag", "", "image reference to tag the image with, e.g. runledger.local/runledger:dev (required)")
		out        = fs.String("o", "", "output tarball path (required)")
		user       = fs.String("user", "65532:65532", "user[:group] the image runs as; numeric, so runAsNonRoot can verify it")
		workdir    = fs.String("workdir", "/", "working directory")
		arch       = fs.String("arch", runtime.GOARCH, "image architecture (must match the binaries)")
		files      listFlag
		entrypoint listFlag
		cmd        listFlag
		env        listFlag
	)
	fs.Var(&files, "file", "SRC=DST: add local file SRC at absolute path DST in the image (repeatable); DST keeps SRC's executable bit")
	fs.Var(&entrypoint, "entrypoint", "an entrypoint element (repeatable, in order)")
	fs.Var(&cmd, "arg", "a default argument, the image's Cmd (repeatable, in order)")
	fs.Var(&env, "env", "KEY=VALUE environment variable (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: image -tag REF -o OUT.tar -file SRC=DST... [-entrypoint E]... [-arg A]... [-user U] [-env K=V]...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *tag == "" || *out == "" || len(files) == 0 || fs.NArg() > 0 {
		fs.Usage()
		return errors.New("-tag, -o and at least one -file are required, and no positional arguments")
	}
	ref, err := name.NewTag(*tag, name.WeakValidation)
	if err != nil {
		return fmt.Errorf("bad -tag: %w", err)
	}

	layerTar, dsts, err := buildLayer(files)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}

	img, err := mutate.Append(empty.Image, mutate.Addendum{
		Layer: layer,
		// Destination paths only: the source paths are local and would make
		// the digest depend on where the repository is checked out.
		History: v1.History{
			Created:   v1.Time{Time: time.Unix(0, 0).UTC()},
			CreatedBy: "hack/tools/image " + strings.Join(dsts, " "),
		},
	})
	if err != nil {
		return fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = *arch
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.Config.Entrypoint = entrypoint
	cf.Config.Cmd = cmd
	cf.Config.User = *user
	cf.Config.WorkingDir = *workdir
	cf.Config.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, env...)
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}

	// Write next to the destination and rename: an interrupted run never
	// leaves a truncated tarball that looks complete.
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	tmp := *out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", *out, err)
	}
	if err := os.Rename(tmp, *out); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s digest=%s id=%s\n", *out, ref.Name(), digest, cfgName)
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
			return nil, nil, fmt.Errorf("bad -file %q: want SRC=/ABSOLUTE/DST", spec)
		}
		dst = strings.TrimPrefix(path.Clean(dst), "/")
		if dst == "" {
			return nil, nil, fmt.Errorf("bad -file %q: DST is the root directory", spec)
		}
		st, err := os.Stat(src)
		if err != nil {
			return nil, nil, err
		}
		if !st.Mode().IsRegular() {
			return nil, nil, fmt.Errorf("-file %s: not a regular file", src)
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
