// The sandbox ("pause") image of the local cluster (hack/cluster.sh): a tiny
// static program, so the cluster needs no registry. Its own module, with no
// dependencies, so it is not part of the runledger module.
module github.com/runledger/runledger/hack/tools/pause

go 1.26.0
