-- +goose NO TRANSACTION
-- +goose Up
-- One process per run and shard, by a lease row (issue #29). It used to be a
-- session-level advisory lock, which a transaction pooler (PgBouncer in
-- transaction mode) takes on one server connection and releases on another.
-- A lease is a row: its holder (a random id of the process) and its expiry,
-- on the database's clock. A process takes it when it is free or expired,
-- renews it while it runs (ledger.ShardLease.Keep), and every chunk's
-- transaction renews it too and so row-locks it: a process that took over
-- an expired lease waits for a chunk in flight to end, and the earlier
-- holder's next chunk fails (runledger.shard_lease_hold raises) and commits
-- nothing. Like the lock it replaces, the lease is coordination, not the
-- guarantee: two processes of one shard would commit nothing twice (the
-- ledger's rule sees to that), but each would count the other's rows as its
-- own completed ones.
--
-- fillfactor 50: the renewals change no indexed column and stay HOT
-- updates on their page.
--
-- Online: a new table and a new function; nothing existing is locked. Each
-- statement commits on its own and may run again after an interruption.
CREATE TABLE IF NOT EXISTS runledger.shard_lease (
    run_uid    text        NOT NULL,
    shard      integer     NOT NULL CHECK (shard >= 0),
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (run_uid, shard)
) WITH (fillfactor = 50);

-- shard_lease_hold renews holder's lease of (run_uid, shard) for ttl, and
-- raises RL001 when the lease is another's (taken over after it expired) or
-- gone (pruned): the calling transaction, a chunk's, then commits nothing.
-- An expired lease nobody took is still its holder's. The caller's
-- privileges (SECURITY INVOKER), the catalog's names only.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION runledger.shard_lease_hold(p_run_uid text, p_shard integer, p_holder text, p_ttl interval)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE runledger.shard_lease SET expires_at = now() + p_ttl
    WHERE run_uid = p_run_uid AND shard = p_shard AND holder = p_holder;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'shard % of run % is no longer this process''s: its lease was taken over by another process, or pruned', p_shard, p_run_uid
            USING ERRCODE = 'RL001';
    END IF;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION runledger.shard_lease_hold(text, integer, text, interval) FROM PUBLIC;

-- Like the other tables runledger writes (00007, 00013): no statement issued
-- from inside a trigger, nor one running at COMMIT, writes it.
DROP TRIGGER IF EXISTS shard_lease_not_from_trigger ON runledger.shard_lease;
CREATE TRIGGER shard_lease_not_from_trigger
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.shard_lease
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() > 0)
    EXECUTE FUNCTION runledger.ledger_not_from_trigger();
DROP TRIGGER IF EXISTS shard_lease_not_at_commit ON runledger.shard_lease;
CREATE TRIGGER shard_lease_not_at_commit
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.shard_lease
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() = 0
          AND pg_catalog.current_query() OPERATOR(pg_catalog.~*) '^\s*(commit|end|prepare\s+transaction)\M')
    EXECUTE FUNCTION runledger.ledger_not_at_commit();

-- The logins `runledger migrate --grant-to` made workers (they may write
-- failure records) take, renew and give back leases, with no grant to run
-- again.
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
        EXECUTE format('GRANT SELECT, INSERT, DELETE, UPDATE (holder, expires_at) ON runledger.shard_lease TO %I', r.grantee);
        EXECUTE format('GRANT EXECUTE ON FUNCTION runledger.shard_lease_hold(text, integer, text, interval) TO %I', r.grantee);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION IF EXISTS runledger.shard_lease_hold(text, integer, text, interval);
DROP TABLE IF EXISTS runledger.shard_lease;
