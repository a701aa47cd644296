package ledger_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// TestBusinessKeyIndexMatchesCatalog keeps ledger.BusinessKeyIndex and the
// migration from drifting apart: the index the classifier names must exist in
// the migrated schema and be exactly the rule.
func TestBusinessKeyIndexMatchesCatalog(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	var (
		unique, partial bool
		columns         []string
		predicate       string
		table           string
	)
	err := pool.QueryRow(context.Background(), `
SELECT ix.indisunique,
       ix.indpred IS NOT NULL,
       array(SELECT a.attname FROM unnest(ix.indkey) WITH ORDINALITY AS k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = k.attnum
             ORDER BY k.ord)::text[],
       coalesce(pg_get_expr(ix.indpred, ix.indrelid), ''),
       t.relname
FROM pg_index ix
JOIN pg_class i ON i.oid = ix.indexrelid
JOIN pg_class t ON t.oid = ix.indrelid
JOIN pg_namespace n ON n.oid = i.relnamespace
WHERE n.nspname = $1 AND i.relname = $2`, ledger.Schema, ledger.BusinessKeyIndex).
		Scan(&unique, &partial, &columns, &predicate, &table)
	require.NoError(t, err, "index %s.%s must exist after migration", ledger.Schema, ledger.BusinessKeyIndex)
	require.Equal(t, "ledger", table, "the rule is on the ledger table")
	require.True(t, unique, "the rule must be a unique index")
	require.True(t, partial, "the rule must be partial: superseded rows must not block")
	require.Equal(t, []string{"occurrence", "entity"}, columns,
		"the rule covers the composite business key, occurrence first (migration 00005: a batch's new occurrence lands on adjacent leaves)")
	require.Equal(t, "(state = 'committed'::text)", predicate, "the filter is part of the invariant")

	// And pg_indexes agrees, for a reader of the catalog's friendlier view.
	var def string
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND indexname = $2`,
		ledger.Schema, ledger.BusinessKeyIndex).Scan(&def))
	require.Equal(t,
		"CREATE UNIQUE INDEX ledger_business_key_uq ON runledger.ledger USING btree (occurrence, entity) WHERE (state = 'committed'::text)",
		def)
}

// TestBatchArraysStorage: the batch's arrays are compressed with lz4 when the
// server has it and stored out of line uncompressed otherwise (never pglz,
// which made writing a batch half as slow again), and carry no statistics
// (ANALYZE would read every array).
func TestBatchArraysStorage(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	lz4 := scalar[bool](t, pool, `SELECT EXISTS (SELECT FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals))`)
	rows, err := pool.Query(context.Background(), `
SELECT attname, attcompression::text, attstorage::text, attstattarget::int
FROM pg_attribute WHERE attrelid = 'runledger.batch'::regclass AND attnum > 0 AND NOT attisdropped AND atttypid <> 'bigint'::regtype AND atttypid <> 'integer'::regtype
ORDER BY attnum`)
	require.NoError(t, err)
	type column struct {
		Name, Compression, Storage string
		Statistics                 int
	}
	columns, err := pgx.CollectRows(rows, pgx.RowToStructByPos[column])
	require.NoError(t, err)
	want := []column{}
	for _, name := range []string{"seqs", "entities", "occurrences", "payloads"} {
		if lz4 {
			want = append(want, column{name, "l", "x", 0})
		} else {
			want = append(want, column{name, "", "e", 0})
		}
	}
	require.Equal(t, want, columns, "lz4 on this server: %v", lz4)
}
