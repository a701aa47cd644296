-- +goose Up
-- A run's batch, fixed once per run (issue #10). A query source's rows are
-- materialised here by the first shard that starts, in one statement; every
-- shard, attempt and resumption then reads its part from there, so the batch
-- is what the query returned once, whatever the query returns later.
--
-- batch_run is the header, one row per run: the shard count the rows were
-- split for, the item count, and for a static source (inline items, a
-- ConfigMap, a file), whose items are not copied, a digest of its items so a
-- later attempt over different items fails instead of counting another batch.
-- `runledger prune` deletes a run's rows and keeps its header as a
-- tombstone (pruned_at), so a pruned batch is never silently materialised again.
CREATE TABLE runledger.batch_run (
    run_uid       text        PRIMARY KEY,
    -- The rows' key: 8 bytes a row instead of the run's 36-byte UID.
    id            bigint      GENERATED ALWAYS AS IDENTITY UNIQUE,
    run_namespace text        NOT NULL,
    run_name      text        NOT NULL,
    source        text        NOT NULL CHECK (source IN ('query', 'static')),
    shards        integer     NOT NULL CHECK (shards >= 1),
    items         bigint      NOT NULL CHECK (items >= 0),
    digest        text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    pruned_at     timestamptz
);

-- The rows of a query source, packed: one row per block of a shard, holding
-- the block's items as parallel arrays (seqs[i], entities[i], occurrences[i],
-- payloads[i] are one item). seq is the item's position in the query's
-- output (from 1) and names it in error messages. A block holds one shard's
-- items among 4000 consecutive seqs, each of at most 16 KiB of text; a larger
-- item is a block of its own (ledger.sqlBatchRows). The items are written
-- with no sort. A shard reads its own blocks only (the primary key's
-- range) and sorts their items in key order (entity, occurrence, seq) when it
-- reads. A key part may be NULL (such an item is a failed item, in shard 0).
--
-- Packed, because one row per item (a heap tuple, an index entry and their WAL
-- each) took about twice as long to write (docs/insert-path.md).
CREATE TABLE runledger.batch (
    batch_id    bigint   NOT NULL, -- batch_run.id; no foreign key: a check per row would slow the one insert, and the same statement writes the header
    shard       integer  NOT NULL,
    block       bigint   NOT NULL,
    seqs        bigint[] NOT NULL,
    entities    text[]   NOT NULL,
    occurrences text[]   NOT NULL,
    payloads    text[]   NOT NULL,
    PRIMARY KEY (batch_id, shard, block)
);
-- The arrays are compressed with lz4 where the server has it, else stored out
-- of line uncompressed: pglz, PostgreSQL's default, was the slowest of the
-- three (docs/insert-path.md).
-- EXECUTE: a server before PostgreSQL 14 could not even parse SET COMPRESSION.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        EXECUTE 'ALTER TABLE runledger.batch
            ALTER COLUMN seqs SET COMPRESSION lz4,
            ALTER COLUMN entities SET COMPRESSION lz4,
            ALTER COLUMN occurrences SET COMPRESSION lz4,
            ALTER COLUMN payloads SET COMPRESSION lz4';
    ELSE
        ALTER TABLE runledger.batch
            ALTER COLUMN seqs SET STORAGE EXTERNAL,
            ALTER COLUMN entities SET STORAGE EXTERNAL,
            ALTER COLUMN occurrences SET STORAGE EXTERNAL,
            ALTER COLUMN payloads SET STORAGE EXTERNAL;
    END IF;
END
$$;
-- +goose StatementEnd
-- Nothing filters on the arrays: ANALYZE (autovacuum's, after each batch)
-- skips them, which makes it about a hundred times cheaper (docs/insert-path.md).
ALTER TABLE runledger.batch
    ALTER COLUMN seqs SET STATISTICS 0,
    ALTER COLUMN entities SET STATISTICS 0,
    ALTER COLUMN occurrences SET STATISTICS 0,
    ALTER COLUMN payloads SET STATISTICS 0;

-- +goose Down
DROP TABLE runledger.batch;
DROP TABLE runledger.batch_run;
