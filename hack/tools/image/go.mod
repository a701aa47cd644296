// Builds container image tarballs from local files (hack/cluster.sh imports
// them into the cluster's containerd), so the local cluster needs no registry
// and no Docker. Its own module, so go-containerregistry is not a dependency
// of the runledger module.
module github.com/runledger/runledger/hack/tools/image

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
