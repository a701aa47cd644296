package ledger

import "context"

// Statements exported to the external test package, which checks their plans,
// and the readers of their answers.
var (
	SQLClaim                   = sqlClaim
	SQLClaimEffect             = sqlClaimEffect
	SQLClaimCopies             = sqlClaimCopies
	SQLClaimCopiesEffect       = sqlClaimCopiesEffect
	SQLInsert                  = sqlInsert
	SQLInsertEffect            = sqlInsertEffect
	SQLInsertFresh             = sqlInsertFresh
	SQLInsertFreshEffect       = sqlInsertFreshEffect
	SQLCreateClaimed           = sqlCreateClaimed
	SQLPinnedSearchPath        = sqlPinnedSearchPath
	SQLMigrationBlockers       = sqlMigrationBlockers
	SQLProveKeptShard          = sqlProveKeptShard
	SQLShardOwnRows            = sqlShardOwnRows
	SQLHeldOfShard             = sqlHeldOfShard
	SQLBeginPinnedSnap         = sqlBeginPinnedSnapshot
	SQLHolders                 = sqlHolders
	SQLHoldersPayload          = sqlHoldersPayload
	SQLHoldersCopies           = sqlHoldersPayloadCopies
	SQLPreload                 = sqlPreload
	SQLSupersede               = sqlSupersede
	SQLFixQueryBatch           = sqlFixQueryBatch
	SQLBatchQueryRows          = sqlBatchQueryRows
	SQLSortShard               = sqlSortShard
	SQLFetchSortedProbe        = sqlFetchSortedProbe
	SQLFetchSortedPlain        = sqlFetchSortedPlain
	SQLBatchOrder              = sqlBatchOrder
	SQLFetchInPlaceProbe       = sqlFetchInPlaceProbe
	SQLFetchInPlacePlain       = sqlFetchInPlacePlain
	SQLClaimFreshSorted        = sqlClaimFreshSorted
	SQLClaimFreshInPlace       = sqlClaimFreshInPlace
	SQLClaimFreshSortedEffect  = sqlClaimFreshSortedEffect
	SQLClaimFreshInPlaceEffect = sqlClaimFreshInPlaceEffect
	SQLBatchWorkMem            = sqlBatchWorkMem
	SQLIndexProbesOnly         = sqlIndexProbesOnly
	SQLKeyRows                 = sqlKeyRows
	SQLKeyRetired              = sqlKeyRetired
	SQLStaticHandled           = sqlStaticAlreadyHandled
	ForEachSkipped             = forEachSkipped
	ForEachKey                 = forEachKey
	IsStatementLevel           = isStatementLevel
	MigrationLockKey           = migrationLockKey
)

// ShardLockKey is the shard lock key of releases before the lease.
var ShardLockKey = shardLockKey

// ShardSQLForTest exposes the shard expression to the external tests.
func ShardSQLForTest(entity, occurrence string, n int) string {
	return sqlShardOf(entity, occurrence, n)
}

// HashBytesExtendedForTest exposes the Go port of PostgreSQL's hash.
func HashBytesExtendedForTest(k []byte, seed uint64) uint64 { return hashBytesExtended(k, seed) }

// QuoteLiteralForTest exposes the literal quoting of fromRun's query.
func QuoteLiteralForTest(s string) string { return quoteLiteral(s) }

// PoolerProbes counts the pools whose probe is remembered.
func PoolerProbes() int {
	n := 0
	poolerProbes.Range(func(any, any) bool { n++; return true })
	return n
}

// OpenSortedBatchForTest opens a reader of shard's sorted copy, sorting the
// shard whatever its order (OpenBatch reads a shard in key order in place).
func (s *Store) OpenSortedBatchForTest(ctx context.Context, h *BatchHeader, runUID string, shard int, heldPayloads bool) (*BatchReader, error) {
	r := &BatchReader{store: s, batch: h, runUID: runUID, shard: shard, heldPayloads: heldPayloads}
	return r, r.sort(ctx)
}

// StatementShardOf is the shard function a query's batch has by default, as
// SQL: a BatchQuery given it (BatchQuery.ShardOf) is fixed by one statement,
// not copied, with the same shards.
func StatementShardOf(n int) func(entity, occurrence string) string {
	return func(e, o string) string { return sqlShardOf(e, o, n) }
}
