package worker

// ShardSQLForTest exposes shardSQL to the external tests.
func ShardSQLForTest(entity, occurrence string, n int) string {
	if n <= 1 {
		return "0"
	}
	return shardSQL(entity, occurrence, n)
}
