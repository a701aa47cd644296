-- +goose NO TRANSACTION
-- +goose Up
-- A shard's items in key order, read by position (issues #27 and #29). A
-- shard used to read its batch through a holdable cursor that sorted its
-- items when opened: it lived on one session, which a transaction pooler
-- (PgBouncer in transaction mode) does not keep between transactions. The
-- shard now sorts its own blocks of runledger.batch once, in one statement,
-- into batch_sorted: each item with its position in the rule's column
-- order (occurrence, then entity), 1024 consecutive positions per block; it
-- reads them by position, one short transaction per fetch, on any
-- connection. batch_sorted_shard says a shard's copy is whole
-- (one row, written by the same statement): a reader trusts no copy without
-- it.
--
-- UNLOGGED: the copy is derived from runledger.batch, which is fixed; it is
-- written without WAL, and a crash (which empties unlogged tables) or a
-- promoted standby costs a shard one sort again, never an item (the order is
-- the same on every sort, so a reader resumes at the position it reached).
-- A shard deletes its copy when it has read it all; `runledger prune` deletes
-- what is left with the batch.
--
-- No compression: nothing of it is written to the WAL or read from disk in
-- the common case, and lz4 would cost CPU on both sides.
--
-- Online: new tables; nothing existing is locked. Each statement commits on
-- its own and may run again after an interruption.
CREATE UNLOGGED TABLE IF NOT EXISTS runledger.batch_sorted (
    batch_id    bigint   NOT NULL,
    shard       integer  NOT NULL,
    block       integer  NOT NULL,
    positions   bigint[] NOT NULL,
    seqs        bigint[] NOT NULL,
    entities    text[]   NOT NULL,
    occurrences text[]   NOT NULL,
    payloads    text[]   NOT NULL,
    PRIMARY KEY (batch_id, shard, block)
);
ALTER TABLE runledger.batch_sorted
    ALTER COLUMN positions SET STORAGE EXTERNAL,
    ALTER COLUMN seqs SET STORAGE EXTERNAL,
    ALTER COLUMN entities SET STORAGE EXTERNAL,
    ALTER COLUMN occurrences SET STORAGE EXTERNAL,
    ALTER COLUMN payloads SET STORAGE EXTERNAL,
    ALTER COLUMN positions SET STATISTICS 0,
    ALTER COLUMN seqs SET STATISTICS 0,
    ALTER COLUMN entities SET STATISTICS 0,
    ALTER COLUMN occurrences SET STATISTICS 0,
    ALTER COLUMN payloads SET STATISTICS 0;

CREATE UNLOGGED TABLE IF NOT EXISTS runledger.batch_sorted_shard (
    batch_id  bigint      NOT NULL,
    shard     integer     NOT NULL,
    items     bigint      NOT NULL CHECK (items >= 0),
    sorted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (batch_id, shard)
);

-- Like the other tables runledger writes (00007, 00013): no statement issued
-- from inside a trigger, nor one running at COMMIT, writes them.
DROP TRIGGER IF EXISTS batch_sorted_not_from_trigger ON runledger.batch_sorted;
CREATE TRIGGER batch_sorted_not_from_trigger
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.batch_sorted
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() > 0)
    EXECUTE FUNCTION runledger.ledger_not_from_trigger();
DROP TRIGGER IF EXISTS batch_sorted_not_at_commit ON runledger.batch_sorted;
CREATE TRIGGER batch_sorted_not_at_commit
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.batch_sorted
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() = 0
          AND pg_catalog.current_query() OPERATOR(pg_catalog.~*) '^\s*(commit|end|prepare\s+transaction)\M')
    EXECUTE FUNCTION runledger.ledger_not_at_commit();
DROP TRIGGER IF EXISTS batch_sorted_shard_not_from_trigger ON runledger.batch_sorted_shard;
CREATE TRIGGER batch_sorted_shard_not_from_trigger
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.batch_sorted_shard
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() > 0)
    EXECUTE FUNCTION runledger.ledger_not_from_trigger();
DROP TRIGGER IF EXISTS batch_sorted_shard_not_at_commit ON runledger.batch_sorted_shard;
CREATE TRIGGER batch_sorted_shard_not_at_commit
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.batch_sorted_shard
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() = 0
          AND pg_catalog.current_query() OPERATOR(pg_catalog.~*) '^\s*(commit|end|prepare\s+transaction)\M')
    EXECUTE FUNCTION runledger.ledger_not_at_commit();

-- The logins `runledger migrate --grant-to` made workers (they may write
-- failure records) sort and read their shards, with no grant to run again.
-- +goose StatementBegin
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT p.grantee
        FROM information_schema.table_privileges AS p
        WHERE p.table_schema = 'runledger' AND p.table_name = 'item_failure'
          AND p.privilege_type = 'INSERT'
          AND p.grantee <> current_user AND p.grantee <> 'PUBLIC'
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, DELETE ON runledger.batch_sorted, runledger.batch_sorted_shard TO %I', r.grantee);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE IF EXISTS runledger.batch_sorted_shard;
DROP TABLE IF EXISTS runledger.batch_sorted;
