// Package ledger is runledger's one insert path and the rule behind it.
//
// Every writer (worker pods, `runledger run`, tests) commits items through
// Store.CommitChunk. What may coexist in committed state is decided by
// PostgreSQL, not by Go: the filtered composite unique index
// runledger.ledger_business_key_uq on the key (entity, occurrence), occurrence
// first, WHERE state = 'committed' refuses a second committed row for a business key, whichever
// process, retry or future caller attempts it. The layers around it each have
// one job:
//
//   - Store.Preload says which keys are already committed: it only saves work
//     and is allowed to be stale.
//   - Leader election (in the controller) only reduces overlap.
//   - The unique index is the guarantee.
//   - IsExpectedBusinessKeyConflict recognises exactly one failure as "already
//     handled": SQLSTATE 23505 on that index. Every other failure stays a
//     failure and is reported as Failed with its error.
//
// The files: classify.go (the classifiers), sql.go (every statement),
// store.go (Store and the preload), commit.go (the insert path), batch.go (a
// query source's fixed batch, a shard's sorted copy of it), shard.go (the
// pinned shard function), lease.go (a shard's lease), pooler.go (telling a
// transaction pooler from PostgreSQL), durability.go (what the server
// promises of a commit), migrate.go. Measurements behind the insert
// path's choices are in docs/insert-path.md.
package ledger
