// make release's steps with logic: the SBOM of the image's binaries
// (CycloneDX, from the Go build information inside them), SHA256SUMS, and
// the kubectl plugin's archives and krew manifest. Its own module, so the
// SBOM library is not a dependency of runledger.
module github.com/runledger/runledger/hack/tools/release

go 1.26.0

require (
	github.com/CycloneDX/cyclonedx-go v0.12.0
	github.com/stretchr/testify v1.12.1
	go.yaml.in/yaml/v3 v3.0.5
)
