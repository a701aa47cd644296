package ledger

// Statements exported to the external test package, which checks their plans,
// and the readers of their answers.
var (
	SQLClaim           = sqlClaim
	SQLHolders         = sqlHolders
	SQLSupersede       = sqlSupersede
	SQLFixQueryBatch   = sqlFixQueryBatch
	SQLBatchCursor     = sqlBatchCursorQuery
	SQLBatchWorkMem    = sqlBatchWorkMem
	SQLIndexProbesOnly = sqlIndexProbesOnly
	ForEachSkipped     = forEachSkipped
	ForEachKey         = forEachKey
	IsStatementLevel   = isStatementLevel
)
