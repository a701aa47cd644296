package worker

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/runledger/runledger/internal/ledger"
)

// MaxShards bounds the number of shards of a run (the API allows 1..256).
const MaxShards = 256

// ShardOf assigns a business key to one of n shards. The function is pinned:
// every process, every version of runledger and PostgreSQL itself (see
// shardSQL) compute the same value, so a key belongs to exactly one shard
// whoever reads it. Changing it would let two shards of one run claim the same
// keys' work twice in their counts; TestShardOfGolden holds it in place.
//
// Definition: h = the first 8 bytes of SHA-256(UTF-8(entity) || 0x00 ||
// UTF-8(occurrence)) read as a big-endian unsigned integer with its top bit
// cleared (so that it is a non-negative PostgreSQL bigint), and shard = h mod n.
//
// SHA-256 rather than a faster non-cryptographic hash (FNV-1a, xxHash) because
// PostgreSQL has it built in (sha256(bytea), PostgreSQL 11+), so the filter of
// a query source runs in SQL, at C speed, and each shard reads only its rows;
// FNV-1a would need 64-bit unsigned multiplication that SQL does not have.
// The 0x00 separator cannot occur in PostgreSQL text, so ("ab","c") and
// ("a","bc") never hash alike.
func ShardOf(k ledger.Key, n int) int {
	if n <= 1 {
		return 0
	}
	h := sha256.New()
	h.Write([]byte(k.Entity))
	h.Write([]byte{0})
	h.Write([]byte(k.Occurrence))
	var sum [sha256.Size]byte
	v := binary.BigEndian.Uint64(h.Sum(sum[:0])[:8]) & math.MaxInt64
	return int(v % uint64(n))
}

// shardSQL is ShardOf as a PostgreSQL expression over two text expressions
// (entity, occurrence) for n shards; NULL when either is NULL. convert_to
// yields the UTF-8 bytes whatever the database encoding, as Go sees them.
func shardSQL(entity, occurrence string, n int) string {
	return fmt.Sprintf(`((('x' || encode(substr(sha256(convert_to(%s, 'UTF8') || decode('00', 'hex') || convert_to(%s, 'UTF8')), 1, 8), 'hex'))::bit(64)::bigint & 9223372036854775807) %% %d)`,
		entity, occurrence, n)
}
