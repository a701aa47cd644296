// Command release holds make release's steps with logic:
//
//	release sbom -o dist/runledger.cdx.json -image REPO@sha256:... -version vX.Y.Z -epoch SECONDS BINARY...
//	release sums -o dist/SHA256SUMS FILE...
//	release plugin -o dist -version vX.Y.Z -url BASE_URL -epoch SECONDS [-file LICENSE] GOOS/GOARCH=BINARY...
//
// sbom lists the Go modules inside the image's binaries (what the Go
// toolchain recorded in them: debug/buildinfo) as a CycloneDX BOM; sums
// writes SHA256SUMS as sha256sum does (sha256sum -c checks it); plugin
// archives the CLI of each platform as kubectl's plugin, kubectl-runledger,
// and writes the krew manifest runledger.yaml that installs them. All are
// byte-for-byte reproducible: sorted, dated by the commit, no random ids.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: release sbom|sums|plugin [flags]")
	}
	switch args[0] {
	case "sbom":
		return runSBOM(args[1:])
	case "sums":
		return runSums(args[1:])
	case "plugin":
		return runPlugin(args[1:])
	default:
		return fmt.Errorf("unknown command %q: want sbom, sums or plugin", args[0])
	}
}

// sums is the text of SHA256SUMS for files, by base name, sorted.
func sums(files []string) (string, error) {
	type entry struct{ name, sum string }
	var entries []entry
	seen := map[string]bool{}
	for _, f := range files {
		name := filepath.Base(f)
		if seen[name] {
			return "", fmt.Errorf("two files named %s", name)
		}
		seen[name] = true
		fh, err := os.Open(f)
		if err != nil {
			return "", err
		}
		h := sha256.New()
		_, err = io.Copy(h, fh)
		_ = fh.Close()
		if err != nil {
			return "", fmt.Errorf("read %s: %w", f, err)
		}
		entries = append(entries, entry{name, hex.EncodeToString(h.Sum(nil))})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	var b strings.Builder
	for _, e := range entries {
		fmt.Fprintf(&b, "%s  %s\n", e.sum, e.name)
	}
	return b.String(), nil
}

func runSums(args []string) error {
	fs := flag.NewFlagSet("release sums", flag.ContinueOnError)
	out := fs.String("o", "", "the SHA256SUMS file to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || fs.NArg() == 0 {
		return errors.New("usage: release sums -o SHA256SUMS FILE [FILE ...]")
	}
	text, err := sums(fs.Args())
	if err != nil {
		return err
	}
	return os.WriteFile(*out, []byte(text), 0o644)
}
