package main

import (
	"bytes"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"runtime/debug"
	"sort"
	"strings"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

var imageRef = regexp.MustCompile(`^(.+)@(sha256:[0-9a-f]{64})$`)

// binary is one of the image's executables and its recorded build.
type binary struct {
	platform string // GOOS/GOARCH
	info     *debug.BuildInfo
}

func readBinary(path string) (binary, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return binary{}, fmt.Errorf("read the build information of %s: %w", path, err)
	}
	b := binary{info: bi}
	var goos, goarch string
	for _, s := range bi.Settings {
		switch s.Key {
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		}
	}
	b.platform = goos + "/" + goarch
	return b, nil
}

func purl(path, version string) string { return "pkg:golang/" + path + "@" + version }

// sbom is the CycloneDX BOM of an image (ref, REPOSITORY@sha256:...) whose
// binaries are bins: one component per Go module (replacements resolved),
// the Go standard library, dependencies from the main module.
func sbom(ref, version string, epoch time.Time, bins []binary) (*cdx.BOM, error) {
	m := imageRef.FindStringSubmatch(ref)
	if m == nil {
		return nil, fmt.Errorf("image %q: want REPOSITORY@sha256:DIGEST", ref)
	}
	if len(bins) == 0 {
		return nil, errors.New("no binary")
	}
	repo, digest := m[1], m[2]
	name := repo[strings.LastIndex(repo, "/")+1:]
	components := map[string]cdx.Component{}
	var mains []string
	platforms := map[string][]string{} // module ref -> platforms it is in
	for _, b := range bins {
		bi := b.info
		mainRef := purl(bi.Main.Path, version)
		if _, ok := components[mainRef]; !ok {
			mains = append(mains, mainRef)
			components[mainRef] = cdx.Component{
				BOMRef: mainRef, Type: cdx.ComponentTypeApplication, Name: bi.Main.Path,
				Version: version, PackageURL: mainRef,
			}
		}
		std := purl("stdlib", bi.GoVersion)
		components[std] = cdx.Component{BOMRef: std, Type: cdx.ComponentTypeLibrary, Name: "stdlib", Version: bi.GoVersion, PackageURL: std}
		platforms[std] = append(platforms[std], b.platform)
		for _, dep := range bi.Deps {
			d := dep
			if d.Replace != nil {
				d = d.Replace
			}
			r := purl(d.Path, d.Version)
			c := cdx.Component{BOMRef: r, Type: cdx.ComponentTypeLibrary, Name: d.Path, Version: d.Version, PackageURL: r, Scope: cdx.ScopeRequired}
			if d.Sum != "" {
				c.Properties = &[]cdx.Property{{Name: "go:sum", Value: d.Sum}}
			}
			if dep.Replace != nil {
				c.Properties = appendProp(c.Properties, "go:replaces", dep.Path+"@"+dep.Version)
			}
			components[r] = c
			platforms[r] = append(platforms[r], b.platform)
		}
	}
	refs := make([]string, 0, len(components))
	for r := range components {
		refs = append(refs, r)
	}
	sort.Strings(refs)
	var list []cdx.Component
	var libs []string
	for _, r := range refs {
		c := components[r]
		if c.Type == cdx.ComponentTypeApplication {
			list = append(list, c)
			continue
		}
		ps := dedupe(platforms[r])
		if len(ps) != len(allPlatforms(bins)) { // in some of the platforms only (not: in some of a platform's binaries)
			c.Properties = appendProp(c.Properties, "runledger:platforms", strings.Join(ps, ","))
		}
		list = append(list, c)
		libs = append(libs, r)
	}
	imageBOMRef := "pkg:oci/" + name + "@" + strings.ReplaceAll(digest, ":", "%3A") + "?repository_url=" + repo
	var deps []cdx.Dependency
	sort.Strings(mains)
	deps = append(deps, cdx.Dependency{Ref: imageBOMRef, Dependencies: &mains})
	for _, mr := range mains {
		l := libs
		deps = append(deps, cdx.Dependency{Ref: mr, Dependencies: &l})
	}

	bom := cdx.NewBOM()
	// The serial number names this BOM: the image's digest, not a random UUID.
	bom.SerialNumber = "urn:uuid:" + uuidFrom(digest)
	bom.Metadata = &cdx.Metadata{
		Timestamp: epoch.UTC().Format(time.RFC3339),
		Tools: &cdx.ToolsChoice{Components: &[]cdx.Component{{
			Type: cdx.ComponentTypeApplication, Name: "runledger hack/tools/release", Version: version,
		}}},
		Component: &cdx.Component{
			BOMRef: imageBOMRef, Type: cdx.ComponentTypeContainer, Name: repo, Version: version,
			PackageURL: imageBOMRef, Hashes: &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: strings.TrimPrefix(digest, "sha256:")}},
			Properties: &[]cdx.Property{{Name: "runledger:platforms", Value: strings.Join(allPlatforms(bins), ",")}},
		},
	}
	bom.Components = &list
	bom.Dependencies = &deps
	return bom, nil
}

func appendProp(p *[]cdx.Property, name, value string) *[]cdx.Property {
	var out []cdx.Property
	if p != nil {
		out = append(out, *p...)
	}
	out = append(out, cdx.Property{Name: name, Value: value})
	return &out
}

func dedupe(s []string) []string {
	sort.Strings(s)
	var out []string
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

func allPlatforms(bins []binary) []string {
	var ps []string
	for _, b := range bins {
		ps = append(ps, b.platform)
	}
	return dedupe(ps)
}

// uuidFrom shapes the first 32 hex digits of a sha256 digest as a UUID
// (version 8: vendor-defined).
func uuidFrom(digest string) string {
	h := []byte(strings.TrimPrefix(digest, "sha256:")[:32])
	h[12] = '8'
	h[16] = "89ab"[strings.IndexByte("0123456789abcdef", h[16])%4]
	return fmt.Sprintf("%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}

func encode(bom *cdx.BOM) ([]byte, error) {
	var buf bytes.Buffer
	enc := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON)
	enc.SetPretty(true)
	if err := enc.EncodeVersion(bom, cdx.SpecVersion1_6); err != nil {
		return nil, fmt.Errorf("encode the sbom: %w", err)
	}
	return buf.Bytes(), nil
}

func runSBOM(args []string) error {
	fs := flag.NewFlagSet("release sbom", flag.ContinueOnError)
	out := fs.String("o", "", "the CycloneDX JSON file to write")
	ref := fs.String("image", "", "the image, REPOSITORY@sha256:DIGEST")
	version := fs.String("version", "", "the release, vX.Y.Z")
	epoch := fs.Int64("epoch", -1, "the BOM's timestamp, in seconds since 1970 (the commit's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *version == "" || *epoch < 0 || fs.NArg() == 0 {
		return errors.New("usage: release sbom -o FILE -image REPO@sha256:... -version vX.Y.Z -epoch SECONDS BINARY [BINARY ...]")
	}
	var bins []binary
	for _, p := range fs.Args() {
		b, err := readBinary(p)
		if err != nil {
			return err
		}
		bins = append(bins, b)
	}
	bom, err := sbom(*ref, *version, time.Unix(*epoch, 0), bins)
	if err != nil {
		return err
	}
	raw, err := encode(bom)
	if err != nil {
		return err
	}
	return os.WriteFile(*out, raw, 0o644)
}
