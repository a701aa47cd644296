// Package e2e holds runledger's end-to-end tests: a real single-node
// Kubernetes cluster (hack/cluster.sh) with the operator installed the way
// users install it (kubectl apply -k config/default, the image substituted
// by a kustomize image override), worker pods that really run, and the
// cluster's PostgreSQL as the ledger.
//
// The tests carry the build tag e2e, so `go test ./...` leaves them out.
// `make e2e` (hack/e2e.sh) brings the cluster up, builds and loads the
// image, deploys the operator, runs
//
//	go test -tags e2e ./test/e2e/... -v -count=1 -timeout 40m
//
// and always takes the cluster down and checks that the host is left as it
// was found (hack/host-check.sh). Against a cluster that is already up and
// deployed:
//
//	source <(hack/cluster.sh env)
//	go test -tags e2e ./test/e2e/... -v -count=1
//
// Without KUBECONFIG and RUNLEDGER_DATABASE_URL (or RUNLEDGER_E2E_DSN) the
// tests skip with the reason; with RUNLEDGER_E2E_REQUIRE=1 (hack/e2e.sh
// sets it) they fail instead.
//
// Each test gets its own namespace (with the worker ServiceAccount, its
// RoleBinding and the ledger Secret, under the restricted Pod Security
// level) and its own PostgreSQL database, so counts are exact per test.
// A pod monitor watches every worker pod of the namespace for the whole
// test and fails it if a shard ever had two live pods; a count monitor
// fails it if a run's completed, alreadyHandled or total ever went down. Tests that disturb
// the whole cluster (leader failover, PostgreSQL restart, TestKueue's
// install of the real Kueue and of the operator from config/kueue) run
// alone; the others run in parallel.
//
// TestSoak (soak_*_test.go) streams runs of every kind while a seeded
// nemesis injects faults, then checks every run against the effects' own
// tables; in the tier it runs its short version (fixed seeds, about 2
// minutes each, and every seed kept under test/soak/seeds/); `make soak`
// runs it for DURATION with SEED (docs/development.md, "The soak").
package e2e
