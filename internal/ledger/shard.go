package ledger

import (
	"encoding/binary"
	"math"
	"math/bits"
)

// shardSeed seeds the shard hash ("RUNLEDGR" in ASCII). Never change it.
const shardSeed uint64 = 0x52554e4c45444752

// ShardOf assigns a business key to one of n shards. The function is pinned:
// every process and every version of runledger computes the same value, and
// so does PostgreSQL itself (shardSQL), so that each shard of a query source
// reads only its rows and a key belongs to exactly one shard whoever reads
// it. TestShardOfGolden holds it in place; changing it would split the keys
// of a running or resumed run differently.
//
// Definition, in PostgreSQL terms:
//
//	h     = hashtextextended(entity COLLATE "C", hashtextextended(occurrence COLLATE "C", shardSeed))
//	shard = (h & 0x7fffffffffffffff) % n
//
// hashtextextended is PostgreSQL's 64-bit, seeded hash of text (Bob
// Jenkins' lookup3, src/common/hashfn.c, hash_bytes_extended); with the "C"
// collation it hashes the UTF-8 bytes. Go computes it with hashBytesExtended.
// It is the hash of PostgreSQL's hash partitioning, which pg_upgrade carries
// across major versions, so it is as stable as the server's on-disk format.
// Not SHA-256 (costly in SQL, per row of the query) nor FNV-1a (SQL lacks
// unsigned 64-bit multiplication): see docs/insert-path.md.
//
// One caveat, documented: hash_bytes_extended reads words in the server's
// byte order, so on a big-endian PostgreSQL server (s390x) the SQL value
// differs from Go's. A run is never affected (a batch is sharded once, where
// it is fixed: a query's by Go as its rows are copied, or by the database
// where one statement fixes it; inline, JSON Lines and object batches by
// Go), but the golden values below hold for little-endian servers (x86-64,
// arm64).
func ShardOf(k Key, n int) int {
	return shardOfBytes([]byte(k.Entity), []byte(k.Occurrence), n)
}

// shardOfBytes is ShardOf over the key parts' bytes.
func shardOfBytes(entity, occurrence []byte, n int) int {
	if n <= 1 {
		return 0
	}
	h := hashBytesExtended(entity, hashBytesExtended(occurrence, shardSeed))
	return int((h & math.MaxInt64) % uint64(n))
}

// hashBytesExtended is PostgreSQL's hash_bytes_extended (src/common/hashfn.c)
// with little-endian word fetches: lookup3 over 12-byte blocks, the seed
// mixed in first as an extra block when non-zero, the 64-bit result b<<32|c.
func hashBytesExtended(k []byte, seed uint64) uint64 {
	a := 0x9e3779b9 + uint32(len(k)) + 3923095
	b, c := a, a
	if seed != 0 {
		a += uint32(seed >> 32)
		b += uint32(seed)
		a, b, c = mix(a, b, c)
	}
	for len(k) >= 12 {
		a += binary.LittleEndian.Uint32(k[0:])
		b += binary.LittleEndian.Uint32(k[4:])
		c += binary.LittleEndian.Uint32(k[8:])
		a, b, c = mix(a, b, c)
		k = k[12:]
	}
	// The last 0..11 bytes: a takes bytes 0-3, b bytes 4-7, c bytes 8-10
	// shifted up by 8 (its lowest byte is reserved for the length).
	for i, x := range k {
		switch {
		case i < 4:
			a += uint32(x) << (8 * i)
		case i < 8:
			b += uint32(x) << (8 * (i - 4))
		default:
			c += uint32(x) << (8 * (i - 7))
		}
	}
	_, b, c = final(a, b, c)
	return uint64(b)<<32 | uint64(c)
}

func mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func final(a, b, c uint32) (uint32, uint32, uint32) {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return a, b, c
}
