package worker

// ShardSQLForTest exposes shardSQL to the external tests.
func ShardSQLForTest(entity, occurrence string, n int) string {
	if n <= 1 {
		return "0"
	}
	return shardSQL(entity, occurrence, n)
}

// HashBytesExtendedForTest exposes the Go port of PostgreSQL's hash.
func HashBytesExtendedForTest(k []byte, seed uint64) uint64 { return hashBytesExtended(k, seed) }
