package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// TestPlugin: one archive per platform (kubectl-runledger and LICENSE,
// dated by the epoch, owned by root), a krew manifest whose sha256 of each
// platform is its archive's and whose uri downloads it, the same bytes
// every time.
func TestPlugin(t *testing.T) {
	src := t.TempDir()
	license := filepath.Join(src, "LICENSE")
	require.NoError(t, os.WriteFile(license, []byte("license text\n"), 0o600))
	var bins []pluginBinary
	for _, p := range [][2]string{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}} {
		path := filepath.Join(src, p[0]+"_"+p[1])
		require.NoError(t, os.WriteFile(path, []byte("binary of "+p[0]+"/"+p[1]), 0o700))
		bins = append(bins, pluginBinary{os: p[0], arch: p[1], path: path})
	}
	epoch := time.Unix(1700000000, 0)
	const base = "https://github.com/runledger/runledger/releases/download/v1.2.3"
	var manifests []string
	var dirs []string
	for range 2 {
		dir := t.TempDir()
		require.NoError(t, plugin(dir, "v1.2.3", base+"/", "https://github.com/runledger/runledger", epoch, []string{license}, bins))
		raw, err := os.ReadFile(filepath.Join(dir, "runledger.yaml"))
		require.NoError(t, err)
		manifests = append(manifests, string(raw))
		dirs = append(dirs, dir)
	}
	require.Equal(t, manifests[0], manifests[1], "reproducible")

	var m struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string
		Metadata   struct{ Name string }
		Spec       struct {
			Version          string
			ShortDescription string `yaml:"shortDescription"`
			Platforms        []struct {
				Selector struct {
					MatchLabels map[string]string `yaml:"matchLabels"`
				}
				URI, SHA256, Bin string
				Files            []struct{ From, To string }
			}
		}
	}
	require.NoError(t, yaml.Unmarshal([]byte(manifests[0]), &m))
	require.Equal(t, "krew.googlecontainertools.github.com/v1alpha2", m.APIVersion)
	require.Equal(t, "Plugin", m.Kind)
	require.Equal(t, "runledger", m.Metadata.Name, "kubectl runledger")
	require.Equal(t, "v1.2.3", m.Spec.Version)
	require.NotEmpty(t, m.Spec.ShortDescription)
	require.Len(t, m.Spec.Platforms, len(bins))
	for i, p := range m.Spec.Platforms {
		b := bins[i]
		name := "kubectl-runledger_" + b.os + "_" + b.arch + ".tar.gz"
		require.Equal(t, map[string]string{"os": b.os, "arch": b.arch}, p.Selector.MatchLabels)
		require.Equal(t, base+"/"+name, p.URI)
		require.Equal(t, "kubectl-runledger", p.Bin)
		require.Equal(t, []struct{ From, To string }{{"kubectl-runledger", "."}, {"LICENSE", "."}}, p.Files)
		for _, dir := range dirs {
			archive, err := os.ReadFile(filepath.Join(dir, name))
			require.NoError(t, err)
			sum := sha256.Sum256(archive)
			require.Equal(t, hex.EncodeToString(sum[:]), p.SHA256, "%s: the manifest's sha256 is the archive's", name)
		}
		require.Equal(t, map[string]string{"kubectl-runledger": "binary of " + b.os + "/" + b.arch, "LICENSE": "license text\n"},
			readArchive(t, filepath.Join(dirs[0], name), epoch))
	}

	// The archives are in SHA256SUMS with the sums the manifest holds.
	text, err := sums([]string{filepath.Join(dirs[0], "kubectl-runledger_linux_amd64.tar.gz")})
	require.NoError(t, err)
	require.Equal(t, m.Spec.Platforms[0].SHA256+"  kubectl-runledger_linux_amd64.tar.gz\n", text)

	require.ErrorContains(t, plugin(t.TempDir(), "1.2.3", base, "", epoch, nil, bins), "v prefix")
	require.ErrorContains(t, plugin(t.TempDir(), "v1.2.3", base, "", epoch, nil, []pluginBinary{bins[0], bins[0]}), "two binaries for linux/amd64")
	require.ErrorContains(t, runPlugin([]string{"-o", t.TempDir(), "-version", "v1.2.3", "-url", base, "linux-amd64=x"}), "want GOOS/GOARCH=PATH")
	require.ErrorContains(t, plugin(t.TempDir(), "v1.2.3", base, "", epoch, nil, []pluginBinary{{os: "linux", arch: "amd64", path: filepath.Join(src, "missing")}}),
		"archive kubectl-runledger_linux_amd64.tar.gz")
}

// readArchive is the files of a plugin archive by name, each checked to be
// a regular file of root's, dated epoch, the binary executable; and its
// gzip header, which holds no name nor time.
func readArchive(t *testing.T, path string, epoch time.Time) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	require.NoError(t, err)
	require.Empty(t, gz.Name)
	require.True(t, gz.ModTime.IsZero(), "no time in the gzip header")
	files := map[string]string{}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.Equal(t, byte(tar.TypeReg), h.Typeflag, h.Name)
		require.True(t, h.ModTime.Equal(epoch), "%s dated %s", h.Name, h.ModTime)
		require.Zero(t, h.Uid, h.Name)
		require.Zero(t, h.Gid, h.Name)
		want := int64(0o644)
		if h.Name == "kubectl-runledger" {
			want = 0o755
		}
		require.Equal(t, want, h.Mode, h.Name)
		body, err := io.ReadAll(tr)
		require.NoError(t, err)
		files[h.Name] = string(body)
	}
	return files
}
