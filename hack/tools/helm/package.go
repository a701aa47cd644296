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
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
)

var (
	semver = regexp.MustCompile(`^v(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)$`)
	digest = regexp.MustCompile(`^(.+)@(sha256:[0-9a-f]{64})$`)
)

// pin sets the image of a release in the chart's values.yaml text.
func pin(values []byte, repo, digest, version string) ([]byte, error) {
	out := values
	for _, r := range []struct{ from, to string }{
		{"\n  repository: runledger\n", "\n  repository: " + repo + "\n"},
		{"\n  tag: dev\n", "\n  tag: " + version + "\n"},
		{"\n  digest: \"\"\n", "\n  digest: \"" + digest + "\"\n"},
	} {
		if bytes.Count(out, []byte(r.from)) != 1 {
			return nil, fmt.Errorf("values.yaml: want one line %q", strings.TrimSpace(r.from))
		}
		out = bytes.Replace(out, []byte(r.from), []byte(r.to), 1)
	}
	return out, nil
}

// packageChart writes dir's chart as a release's: version and appVersion
// from version (vX.Y.Z), the image ref pinned, every entry dated epoch.
func packageChart(dir, version, ref string, epoch time.Time, outDir string) (string, error) {
	m := semver.FindStringSubmatch(version)
	if m == nil {
		return "", fmt.Errorf("version %q: want vMAJOR.MINOR.PATCH[-PRERELEASE]", version)
	}
	im := digest.FindStringSubmatch(ref)
	if im == nil {
		return "", fmt.Errorf("image %q: want REPOSITORY@sha256:DIGEST", ref)
	}
	c, err := loader.Load(dir)
	if err != nil {
		return "", fmt.Errorf("load chart %s: %w", dir, err)
	}
	c.Metadata.Version = m[1]
	c.Metadata.AppVersion = version
	found := false
	for _, f := range c.Raw {
		if f.Name == chartutil.ValuesfileName {
			if f.Data, err = pin(f.Data, im[1], im[2], version); err != nil {
				return "", err
			}
			found = true
		}
	}
	if !found {
		return "", errors.New("the chart has no values.yaml")
	}
	tmp, err := os.MkdirTemp("", "chart-package-")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	saved, err := chartutil.Save(c, tmp)
	if err != nil {
		return "", fmt.Errorf("package chart: %w", err)
	}
	dst := filepath.Join(outDir, filepath.Base(saved))
	if err := normalize(saved, dst, epoch); err != nil {
		return "", fmt.Errorf("normalize %s: %w", filepath.Base(saved), err)
	}
	return dst, nil
}

// normalize rewrites Helm's archive (dated now) with every entry dated
// epoch, owned by 0:0: the same chart gives the same bytes.
func normalize(src, dst string, epoch time.Time) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Header.Extra = zr.Header.Extra // Helm's marker
	zw.Header.Comment = zr.Header.Comment
	tr := tar.NewReader(zr)
	tw := tar.NewWriter(zw)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		nh := &tar.Header{Name: h.Name, Mode: h.Mode, Size: int64(len(body)), ModTime: epoch.UTC(), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(nh); err != nil {
			return err
		}
		if _, err := tw.Write(body); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(dst, buf.Bytes(), 0o644)
}

func runPackage(args []string) error {
	fs := flag.NewFlagSet("chart package", flag.ContinueOnError)
	dir := fs.String("chart", "charts/runledger", "the chart directory")
	version := fs.String("version", "", "the release, vX.Y.Z")
	ref := fs.String("image", "", "the release's image, REPOSITORY@sha256:DIGEST")
	epoch := fs.Int64("epoch", -1, "the date of every archive entry, in seconds since 1970 (the commit's)")
	out := fs.String("o", "dist", "the directory of the archive")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *epoch < 0 {
		return errors.New("set -epoch (git log -1 --format=%ct)")
	}
	p, err := packageChart(*dir, *version, *ref, time.Unix(*epoch, 0), *out)
	if err != nil {
		return err
	}
	fmt.Println(p)
	return nil
}
