// Package worker turns a declared batch into exact counts: it reads one
// shard's items from a source (inline items, JSON Lines, or an SQL query
// run once per run and fixed in the ledger database, see query.go),
// validates them, skips what the ledger
// already holds (the preload), commits the rest through the ledger's one
// insert path (ledger.Store.CommitChunk), and reports
//
//	completed + alreadyHandled + failed == items declared
//
// per shard, exactly, across restarts: an item that an earlier attempt of the
// same run committed counts as completed, never as already handled.
//
// The package knows nothing about Kubernetes except kube.go, reporter.go
// and podclient.go, the in-pod reporting used by `runledger worker` (over
// net/http: the worker links no Kubernetes client); `runledger run` drives
// the same engine from a manifest on a laptop. Both prepare the ledger with Prepare
// (connect, migrate, check); `runledger run` runs its shards with RunShards.
//
// Files: item.go (validation, whose rules internal/batchitem holds),
// source.go (inline and JSON Lines), query.go (the SQL source), batch.go (the run's fixed batch), prepare.go (Prepare,
// RunShards), engine.go (the chunk loop), retry.go (back-off), report.go
// (reports and failures), progress.go (human progress), kube.go (pod mode),
// reporter.go (the reports on the pod), podclient.go (their API requests).
package worker
