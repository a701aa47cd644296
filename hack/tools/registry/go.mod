// The local cluster's OCI registry (hack/cluster.sh). Its own module, so
// go-containerregistry is not a dependency of the runledger module.
module github.com/runledger/runledger/hack/tools/registry

go 1.26.0

require github.com/google/go-containerregistry v0.22.1
