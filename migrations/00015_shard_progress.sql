-- +goose NO TRANSACTION
-- +goose Up
-- Each shard's latest progress, one row per run and shard (issue #28): the
-- channel through which a run's workers elect one reporter and hand it their
-- counts, so that a run's progress costs the API server one pod write per
-- report interval whatever its shard count (api/v1alpha1/contract.go,
-- "Reports"). A worker upserts its shard's row every report interval
-- (ledger.Store.PublishProgress); the live shard with the lowest index reads
-- every row of its run and writes them onto its own pod. The counts are the
-- worker's, cumulative and exact for what it settled; the shard's final
-- report stays its termination message. Nothing here decides what is
-- committed: a lost or forged row only shows other progress for a while.
--
-- attempt never goes down (a replaced pod still finishing its chunk does not
-- overwrite its successor's row); updated_at is the database's clock, so a
-- row's age needs no agreement between the nodes' clocks. `runledger prune
-- --older-than` deletes a pruned run's rows.
--
-- fillfactor 50: an upsert that changes no indexed column stays a HOT update
-- on its page, so a run's rows take no index write and little vacuum.
--
-- Online: a new table; the ledger is not locked. Each statement commits on
-- its own and may run again after an interruption.
CREATE TABLE IF NOT EXISTS runledger.shard_progress (
    run_uid         text        NOT NULL,
    shard           integer     NOT NULL CHECK (shard >= 0),
    attempt         integer     NOT NULL CHECK (attempt >= 0),
    total           bigint      NOT NULL CHECK (total >= 0),
    completed       bigint      NOT NULL CHECK (completed >= 0),
    already_handled bigint      NOT NULL CHECK (already_handled >= 0),
    failed          bigint      NOT NULL CHECK (failed >= 0),
    payload_changed bigint      NOT NULL CHECK (payload_changed >= 0),
    message         text        NOT NULL CHECK (octet_length(message) <= 1024),
    done            boolean     NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_uid, shard)
) WITH (fillfactor = 50);

-- Like the other tables runledger writes (00007, 00013): no statement issued
-- from inside a trigger, nor one running at COMMIT, writes it.
DROP TRIGGER IF EXISTS shard_progress_not_from_trigger ON runledger.shard_progress;
CREATE TRIGGER shard_progress_not_from_trigger
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.shard_progress
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() > 0)
    EXECUTE FUNCTION runledger.ledger_not_from_trigger();
DROP TRIGGER IF EXISTS shard_progress_not_at_commit ON runledger.shard_progress;
CREATE TRIGGER shard_progress_not_at_commit
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.shard_progress
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() = 0
          AND pg_catalog.current_query() OPERATOR(pg_catalog.~*) '^\s*(commit|end|prepare\s+transaction)\M')
    EXECUTE FUNCTION runledger.ledger_not_at_commit();

-- The logins `runledger migrate --grant-to` made workers (they may write
-- failure records) publish their progress too, with no grant to run again.
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
        EXECUTE format('GRANT SELECT, INSERT, UPDATE (attempt, total, completed, already_handled, failed, payload_changed, message, done, updated_at) ON runledger.shard_progress TO %I', r.grantee);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE IF EXISTS runledger.shard_progress;
