package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const testRef = "reg.example/platform/runledger@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// TestSBOM: the BOM of a binary lists the Go modules built into it (this
// test binary holds cyclonedx-go), the same bytes every time.
func TestSBOM(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	b, err := readBinary(self)
	require.NoError(t, err)
	var outs [][]byte
	for range 2 {
		bom, err := sbom(testRef, "v1.2.3", time.Unix(1700000000, 0), []binary{b, b})
		require.NoError(t, err)
		raw, err := encode(bom)
		require.NoError(t, err)
		outs = append(outs, raw)
	}
	require.Equal(t, string(outs[0]), string(outs[1]), "reproducible")

	var doc struct {
		BOMFormat, SpecVersion, SerialNumber string
		Metadata                             struct {
			Timestamp string
			Component struct{ Type, Name, Version, Purl string }
		}
		Components []struct {
			Type, Name, Version, Purl string
			Properties                []struct{ Name, Value string }
		}
	}
	require.NoError(t, json.Unmarshal(outs[0], &doc))
	require.Equal(t, "CycloneDX", doc.BOMFormat)
	require.Equal(t, "1.6", doc.SpecVersion)
	require.Equal(t, "urn:uuid:01234567-89ab-8def-8123-456789abcdef", doc.SerialNumber)
	require.Equal(t, "2023-11-14T22:13:20Z", doc.Metadata.Timestamp)
	require.Equal(t, "container", doc.Metadata.Component.Type)
	require.Equal(t, "reg.example/platform/runledger", doc.Metadata.Component.Name)
	require.Equal(t, "v1.2.3", doc.Metadata.Component.Version)
	names := map[string]string{}
	for _, c := range doc.Components {
		names[c.Name] = c.Purl
		for _, p := range c.Properties {
			require.NotEqual(t, "runledger:platforms", p.Name, "%s: in every platform (two binaries of one platform)", c.Name)
		}
	}
	require.Equal(t, "pkg:golang/github.com/CycloneDX/cyclonedx-go@v0.12.0", names["github.com/CycloneDX/cyclonedx-go"])
	require.Contains(t, names, "stdlib")
	require.Len(t, doc.Components, len(b.info.Deps)+2, "every module once (two binaries), stdlib and the main module")

	_, err = sbom("reg.example/runledger:v1", "v1.2.3", time.Unix(0, 0), []binary{b})
	require.ErrorContains(t, err, "want REPOSITORY@sha256:DIGEST")
	_, err = readBinary(filepath.Join(t.TempDir(), "missing"))
	require.ErrorContains(t, err, "read the build information")
}

// TestSums: SHA256SUMS as sha256sum writes it, sorted, and sha256sum -c agrees.
func TestSums(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"b.yaml": "b\n", "a.tgz": "a"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	text, err := sums([]string{filepath.Join(dir, "b.yaml"), filepath.Join(dir, "a.tgz")})
	require.NoError(t, err)
	require.Equal(t, "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb  a.tgz\n"+
		"0263829989b6fd954f72baaf2fc64bc2e2f01d692d4de72986ea808f6e99813f  b.yaml\n", text)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "SHA256SUMS"), []byte(text), 0o644))
	if _, err := exec.LookPath("sha256sum"); err == nil {
		cmd := exec.Command("sha256sum", "-c", "SHA256SUMS")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
	}
	_, err = sums([]string{filepath.Join(dir, "a.tgz"), filepath.Join(dir, "a.tgz")})
	require.ErrorContains(t, err, "two files named a.tgz")
	require.False(t, strings.Contains(text, dir), "names only")
}
