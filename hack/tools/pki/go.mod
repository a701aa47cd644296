// The local cluster's certificates and kubeconfigs (hack/cluster.sh up). Its
// own module, with no dependencies, so it is not part of the runledger module.
module github.com/runledger/runledger/hack/tools/pki

go 1.26.0
