package ledger

// Statements exported to the external test package, which checks their plans.
var (
	SQLClaim           = sqlClaim
	SQLHolders         = sqlHolders
	SQLSupersede       = sqlSupersede
	SQLIndexProbesOnly = sqlIndexProbesOnly
)
