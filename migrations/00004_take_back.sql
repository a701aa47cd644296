-- +goose Up
-- Taking back a claim inside the claiming transaction (issue #14). A
-- processor (spec.effect.processor) is called with the items a chunk's
-- transaction has just claimed; the keys it refuses, or asks to retry, must
-- not commit, while the keys it accepted stay claimed (and so stay locked
-- against every other writer) until COMMIT. Rolling back to a savepoint would
-- release the accepted keys too, for a moment in which another run could
-- claim and process them: so the transaction deletes the rows it inserted
-- for the refused keys (and restores the rows it superseded for them), and
-- nothing else.
--
-- The append-only trigger allows exactly that: inside
-- runledger.ledger_take_back only (the function sets runledger.take_back for
-- its own duration, in its body), on a row version this same transaction wrote (its xmin
-- is still in progress: a row version of another transaction in progress is
-- never visible to a DELETE or UPDATE, so "in progress" means "ours"). Such a
-- row was never committed; every committed row keeps all its protection, and
-- an effect's own DELETE or UPDATE of its chunk's rows is still refused. The
-- function runs as the ledger's owner (a worker login has no DELETE
-- privilege) and anyone may call it: it can only take back the caller's own
-- uncommitted rows.

-- runledger.ledger_written_by_this_xact: is the visible version of ledger row
-- row_id written by the current transaction or one of its subtransactions (a
-- savepoint's rows carry the savepoint's xid, above the top-level one)?
-- age(xmin) is the distance from this transaction's top-level xid: 0 for its
-- own, negative for a later xid (a subtransaction's, or a later transaction's
-- committed row), positive for an earlier one. Only for a distance <= 0 is
-- the 64-bit xid (top-level minus the distance) looked up: it is then an xid
-- already assigned, never one of another epoch or a frozen one.
-- +goose StatementBegin
CREATE FUNCTION runledger.ledger_written_by_this_xact(row_id bigint) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path = pg_catalog
AS $$
    SELECT coalesce(bool_or(CASE
               WHEN v.age <= 0 THEN pg_xact_status((v.c - v.age)::text::xid8) = 'in progress'
               ELSE false
           END), false)
    FROM (
        SELECT age(l.xmin) AS age, pg_current_xact_id()::text::bigint AS c
        FROM runledger.ledger AS l
        WHERE l.id = row_id
    ) AS v
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION runledger.ledger_append_only() RETURNS trigger
    LANGUAGE plpgsql
    -- Pinned: the caller's search_path must not decide which pg_has_role runs.
    SET search_path = pg_catalog
AS $$
BEGIN
    -- Taking back a claim: only inside ledger_take_back (which sets
    -- runledger.take_back for its own duration), only a row this very
    -- transaction wrote (its row version is still in progress), only
    -- deleting the committed row it inserted or restoring the row it
    -- superseded. A committed row of any other transaction is never touched.
    IF TG_OP <> 'TRUNCATE' AND current_setting('runledger.take_back', true) = 'on'
       AND runledger.ledger_written_by_this_xact(OLD.id) THEN
        IF TG_OP = 'DELETE' AND OLD.state = 'committed' THEN
            RETURN OLD;
        END IF;
        IF TG_OP = 'UPDATE' AND OLD.state = 'superseded' AND NEW.state = 'committed' AND NEW.superseded_at IS NULL
           AND to_jsonb(NEW) - 'state' - 'superseded_at' = to_jsonb(OLD) - 'state' - 'superseded_at' THEN
            RETURN NEW;
        END IF;
    END IF;
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'runledger.ledger is append-only: TRUNCATE refused'
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'ledger_append_only',
                  SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
                  HINT = 'Committed rows are never deleted; superseded rows are pruned by the owner with runledger prune --superseded-older-than.';
    END IF;
    IF TG_OP = 'DELETE' THEN
        IF OLD.state = 'superseded'
           AND pg_has_role(current_user, (SELECT c.relowner FROM pg_class AS c WHERE c.oid = TG_RELID), 'MEMBER') THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'runledger.ledger is append-only: DELETE of the % row % (%/% of run %) refused',
                OLD.state, OLD.id, OLD.entity, OLD.occurrence, OLD.run_uid
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'ledger_append_only',
                  SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
                  HINT = 'Committed rows are never deleted; superseded rows are pruned by the owner with runledger prune --superseded-older-than.';
    END IF;
    -- UPDATE. Every column but state and superseded_at is compared through
    -- to_jsonb, so a column added later is protected without touching this.
    IF OLD.state = 'committed' AND NEW.state = 'superseded' AND NEW.superseded_at IS NOT NULL
       AND to_jsonb(NEW) - 'state' - 'superseded_at' = to_jsonb(OLD) - 'state' - 'superseded_at' THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'runledger.ledger is append-only: UPDATE of the % row % (%/% of run %) refused',
            OLD.state, OLD.id, OLD.entity, OLD.occurrence, OLD.run_uid
        USING ERRCODE = 'restrict_violation', CONSTRAINT = 'ledger_append_only',
              SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
              DETAIL = 'The only change allowed is committed -> superseded (state and superseded_at), every other column unchanged.';
END
$$;
-- +goose StatementEnd

-- runledger.ledger_take_back deletes the committed rows this transaction
-- inserted for the given keys and restores, by id, the rows it superseded for
-- them (restore); it returns how many rows it deleted. Rows of other
-- transactions are left alone (the WHERE says so, and the trigger checks it
-- again).
-- +goose StatementBegin
CREATE FUNCTION runledger.ledger_take_back(entities text[], occurrences text[], restore bigint[]) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog
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

-- +goose Down
DROP FUNCTION runledger.ledger_take_back(text[], text[], bigint[]);
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION runledger.ledger_append_only() RETURNS trigger
    LANGUAGE plpgsql
    -- Pinned: the caller's search_path must not decide which pg_has_role runs.
    SET search_path = pg_catalog
AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'runledger.ledger is append-only: TRUNCATE refused'
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'ledger_append_only',
                  SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
                  HINT = 'Committed rows are never deleted; superseded rows are pruned by the owner with runledger prune --superseded-older-than.';
    END IF;
    IF TG_OP = 'DELETE' THEN
        IF OLD.state = 'superseded'
           AND pg_has_role(current_user, (SELECT c.relowner FROM pg_class AS c WHERE c.oid = TG_RELID), 'MEMBER') THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'runledger.ledger is append-only: DELETE of the % row % (%/% of run %) refused',
                OLD.state, OLD.id, OLD.entity, OLD.occurrence, OLD.run_uid
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'ledger_append_only',
                  SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
                  HINT = 'Committed rows are never deleted; superseded rows are pruned by the owner with runledger prune --superseded-older-than.';
    END IF;
    -- UPDATE. Every column but state and superseded_at is compared through
    -- to_jsonb, so a column added later is protected without touching this.
    IF OLD.state = 'committed' AND NEW.state = 'superseded' AND NEW.superseded_at IS NOT NULL
       AND to_jsonb(NEW) - 'state' - 'superseded_at' = to_jsonb(OLD) - 'state' - 'superseded_at' THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'runledger.ledger is append-only: UPDATE of the % row % (%/% of run %) refused',
            OLD.state, OLD.id, OLD.entity, OLD.occurrence, OLD.run_uid
        USING ERRCODE = 'restrict_violation', CONSTRAINT = 'ledger_append_only',
              SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
              DETAIL = 'The only change allowed is committed -> superseded (state and superseded_at), every other column unchanged.';
END
$$;
-- +goose StatementEnd
DROP FUNCTION runledger.ledger_written_by_this_xact(bigint);
