// Command etcd is the etcd server, built from the Go module proxy by
// hack/k8s-bins.sh (for envtest's KUBEBUILDER_ASSETS and local clusters).
// It is identical to go.etcd.io/etcd/server/v3's own main package.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
