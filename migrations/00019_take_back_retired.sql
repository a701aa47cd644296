-- +goose Up
-- A take-back takes back the retired-key record too (issue #43.6). A
-- Supersede run retires the key's committed row (ledger_record_retired, 00009,
-- records the run it retired in runledger.ledger_retired) before its
-- processor answers; a key the processor refuses is taken back
-- (ledger_take_back, 00004): the run's row deleted, the earlier holder's row
-- committed again. The record stayed, and `runledger key` showed the earlier
-- run both as the key's holder and as retired from it: a history that never
-- happened.
--
-- ledger_take_back now deletes, for each row it restores, the record of that
-- row's run and key, if this transaction wrote it (its row version is in
-- progress, as ledger_written_by_this_xact reads a ledger row's): a record
-- another transaction wrote (the run retired from the key before, by a row of
-- its own) is real history and stays. ledger_retired has no append-only
-- trigger (00009: a worker login may read it, never write it); the function
-- runs as its owner, who may delete.
--
-- The readers of ledger_retired (sqlSupersede, heldFor/ownRetired, a run's
-- already handled items, runledger key) ask it only for a key whose
-- committed row is not the run's own: a restored row is its run's own, so
-- their verdicts are unchanged, only the key's history is right now.
--
-- Online: CREATE OR REPLACE of a function locks no table; a chunk in flight
-- calls the old body or the new one, each whole. The function keeps its
-- owner and its grants (the worker logins' EXECUTE, 00007).
SET LOCAL lock_timeout = '5s';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION runledger.ledger_take_back(entities text[], occurrences text[], restore bigint[]) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deleted bigint;
BEGIN
    -- Set in the body, not as the function's SET clause: that would need
    -- a superuser's (or GRANT SET's) right to a custom parameter at CREATE
    -- time. Transaction-local, and cleared before returning; an error ends
    -- the (sub)transaction, which takes the setting back with it.
    PERFORM pg_catalog.set_config('runledger.take_back', 'on', true);
    DELETE FROM runledger.ledger AS l
    -- unnest(a, b), spelled out: only the unqualified name has that form.
    USING ROWS FROM (pg_catalog.unnest(entities), pg_catalog.unnest(occurrences)) AS k(entity, occurrence)
    WHERE l.entity = k.entity AND l.occurrence = k.occurrence AND l.state = 'committed'
      AND runledger.ledger_written_by_this_xact(l.id);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    -- The record's xmin is this transaction's (or one of its
    -- subtransactions') exactly when its age is <= 0 and that xid is still
    -- in progress: ledger_written_by_this_xact's test, on the record.
    WITH restored AS (
        UPDATE runledger.ledger AS l SET state = 'committed', superseded_at = NULL
        WHERE l.id = ANY (restore) AND l.state = 'superseded'
          AND runledger.ledger_written_by_this_xact(l.id)
        RETURNING l.run_uid, l.occurrence, l.entity
    )
    DELETE FROM runledger.ledger_retired AS r
    USING restored AS s
    WHERE r.run_uid = s.run_uid AND r.occurrence = s.occurrence AND r.entity = s.entity
      AND CASE
              WHEN pg_catalog.age(r.xmin) <= 0
              THEN pg_catalog.pg_xact_status((pg_catalog.pg_current_xact_id()::text::bigint - pg_catalog.age(r.xmin))::text::xid8) = 'in progress'
              ELSE false
          END;
    PERFORM pg_catalog.set_config('runledger.take_back', '', true);
    RETURN deleted;
END
$$;
-- +goose StatementEnd

-- +goose Down
SET LOCAL lock_timeout = '5s';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION runledger.ledger_take_back(entities text[], occurrences text[], restore bigint[]) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deleted bigint;
BEGIN
    -- Set in the body, not as the function's SET clause: that would need
    -- a superuser's (or GRANT SET's) right to a custom parameter at CREATE
    -- time. Transaction-local, and cleared before returning; an error ends
    -- the (sub)transaction, which takes the setting back with it.
    PERFORM set_config('runledger.take_back', 'on', true);
    DELETE FROM runledger.ledger AS l
    USING unnest(entities, occurrences) AS k(entity, occurrence)
    WHERE l.entity = k.entity AND l.occurrence = k.occurrence AND l.state = 'committed'
      AND runledger.ledger_written_by_this_xact(l.id);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    UPDATE runledger.ledger AS l SET state = 'committed', superseded_at = NULL
    WHERE l.id = ANY (restore) AND l.state = 'superseded'
      AND runledger.ledger_written_by_this_xact(l.id);
    PERFORM set_config('runledger.take_back', '', true);
    RETURN deleted;
END
$$;
-- +goose StatementEnd
