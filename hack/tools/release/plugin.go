package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// pluginBin is the executable kubectl runs for kubectl runledger.
const pluginBin = "kubectl-runledger"

// platformPath is GOOS/GOARCH=PATH, one binary of the plugin.
var platformPath = regexp.MustCompile(`^([a-z0-9]+)/([a-z0-9]+)=(.+)$`)

// pluginBinary is the plugin's executable for one platform.
type pluginBinary struct{ os, arch, path string }

// archiveName is the archive of one platform's plugin.
func (b pluginBinary) archiveName() string {
	return pluginBin + "_" + b.os + "_" + b.arch + ".tar.gz"
}

// krewPlugin is a krew plugin manifest
// (https://krew.sigs.k8s.io/docs/developer-guide/plugin-manifest/); krew
// refuses one of another apiVersion, and metadata.name is the file's name.
type krewPlugin struct {
	APIVersion string                `yaml:"apiVersion"`
	Kind       string                `yaml:"kind"`
	Metadata   struct{ Name string } `yaml:"metadata"`
	Spec       krewSpec              `yaml:"spec"`
}

type krewSpec struct {
	Version          string         `yaml:"version"`
	Homepage         string         `yaml:"homepage,omitempty"`
	ShortDescription string         `yaml:"shortDescription"`
	Description      string         `yaml:"description"`
	Caveats          string         `yaml:"caveats,omitempty"`
	Platforms        []krewPlatform `yaml:"platforms"`
}

type krewPlatform struct {
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	URI    string     `yaml:"uri"`
	SHA256 string     `yaml:"sha256"`
	Files  []krewFile `yaml:"files"`
	Bin    string     `yaml:"bin"`
}

type krewFile struct {
	From string `yaml:"from"`
	To   string `yaml:"to"`
}

const (
	pluginShort       = "Exactly-once batch runs: list a run's items, prove its status, run a batch, migrate the ledger"
	pluginDescription = `runledger's CLI as kubectl runledger: list a ProcessingRun's items and
their verdicts from the ledger database (kubectl runledger items RUN
--failed), prove a finished run's status (kubectl runledger verify),
find which run holds a key (kubectl runledger key), trigger or backfill a
schedule, run a batch locally, and migrate or prune the ledger database.
`
	pluginCaveats = `The commands that read the ledger need its connection string:
--dsn-file FILE, or $RUNLEDGER_DATABASE_URL.

For completion of kubectl runledger (kubectl >= 1.26), link the completion
helper next to the plugin, e.g.:
  ln -s kubectl-runledger ~/.krew/bin/kubectl_complete-runledger
`
)

// plugin writes into dir one archive per binary (the binary as
// kubectl-runledger, and files beside it) and the krew manifest
// runledger.yaml that installs them from baseURL, every byte fixed by the
// inputs and epoch.
func plugin(dir, version, baseURL, homepage string, epoch time.Time, files []string, bins []pluginBinary) error {
	if len(bins) == 0 {
		return errors.New("no binary")
	}
	if !strings.HasPrefix(version, "v") {
		return fmt.Errorf("version %q: krew wants a v prefix (vX.Y.Z)", version)
	}
	m := krewPlugin{APIVersion: "krew.googlecontainertools.github.com/v1alpha2", Kind: "Plugin"}
	m.Metadata.Name = "runledger"
	m.Spec = krewSpec{Version: version, Homepage: homepage, ShortDescription: pluginShort, Description: pluginDescription, Caveats: pluginCaveats}
	seen := map[string]bool{}
	for _, b := range bins {
		name := b.archiveName()
		if seen[name] {
			return fmt.Errorf("two binaries for %s/%s", b.os, b.arch)
		}
		seen[name] = true
		archive, err := pluginArchive(b.path, files, epoch)
		if err != nil {
			return fmt.Errorf("archive %s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), archive, 0o644); err != nil {
			return err
		}
		sum := sha256.Sum256(archive)
		p := krewPlatform{URI: strings.TrimSuffix(baseURL, "/") + "/" + name, SHA256: hex.EncodeToString(sum[:]), Bin: pluginBin}
		p.Selector.MatchLabels = map[string]string{"os": b.os, "arch": b.arch}
		p.Files = []krewFile{{From: pluginBin, To: "."}}
		for _, f := range files {
			p.Files = append(p.Files, krewFile{From: filepath.Base(f), To: "."})
		}
		m.Spec.Platforms = append(m.Spec.Platforms, p)
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&m); err != nil {
		return fmt.Errorf("encode the krew manifest: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("encode the krew manifest: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "runledger.yaml"), out.Bytes(), 0o644)
}

// pluginArchive is a tar.gz of bin as kubectl-runledger and files by base
// name, each dated epoch and owned by root, with a gzip header that holds
// no name nor time: the same inputs give the same bytes.
func pluginArchive(bin string, files []string, epoch time.Time) ([]byte, error) {
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(gz)
	add := func(path, name string, mode int64) error {
		body, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: epoch.UTC(), Format: tar.FormatUSTAR}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		_, err = tw.Write(body)
		return err
	}
	if err := add(bin, pluginBin, 0o755); err != nil {
		return nil, err
	}
	for _, f := range files {
		if err := add(f, filepath.Base(f), 0o644); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

type fileList []string

func (l *fileList) String() string     { return strings.Join(*l, ",") }
func (l *fileList) Set(v string) error { *l = append(*l, v); return nil }

func runPlugin(args []string) error {
	fs := flag.NewFlagSet("release plugin", flag.ContinueOnError)
	out := fs.String("o", "", "the directory to write the archives and runledger.yaml into")
	version := fs.String("version", "", "the release's version, vX.Y.Z")
	url := fs.String("url", "", "the base URL the archives are downloaded from")
	homepage := fs.String("homepage", "", "the project's page")
	epoch := fs.Int64("epoch", 0, "the date of every archived file, in Unix seconds (the commit's)")
	var files fileList
	fs.Var(&files, "file", "a file to put beside the binary in every archive (repeatable), e.g. LICENSE")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *version == "" || *url == "" || fs.NArg() == 0 {
		return errors.New("usage: release plugin -o DIR -version vX.Y.Z -url BASE_URL -epoch SECONDS [-homepage URL] [-file FILE]... GOOS/GOARCH=BINARY [GOOS/GOARCH=BINARY ...]")
	}
	var bins []pluginBinary
	for _, a := range fs.Args() {
		m := platformPath.FindStringSubmatch(a)
		if m == nil {
			return fmt.Errorf("binary %q: want GOOS/GOARCH=PATH", a)
		}
		bins = append(bins, pluginBinary{os: m[1], arch: m[2], path: m[3]})
	}
	return plugin(*out, *version, *url, *homepage, time.Unix(*epoch, 0), files, bins)
}
