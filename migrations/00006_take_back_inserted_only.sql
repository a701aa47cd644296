-- +goose Up
-- Taking back a claim deletes only a row the transaction INSERTED (issue #12).
-- 00004 allowed deleting any committed row version the transaction wrote, and
-- superseding then restoring another run's committed row makes its visible
-- version one the transaction wrote: an effect could so delete another run's
-- committed row and insert a forged one in its place, which the deferred check
-- (a superseded key has a committed row again) accepts. A row the transaction
-- inserted carries the transaction's start as created_at (the insert path
-- leaves the column to its default, now()); a restored row keeps the
-- created_at of the transaction that committed it.
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
    -- deleting the committed row it inserted (created by this transaction:
    -- created_at is its start, the column's default) or restoring the row it
    -- superseded. A committed row of any other transaction is never deleted,
    -- even once superseded and restored by this one.
    IF TG_OP <> 'TRUNCATE' AND current_setting('runledger.take_back', true) = 'on'
       AND runledger.ledger_written_by_this_xact(OLD.id) THEN
        IF TG_OP = 'DELETE' AND OLD.state = 'committed' AND OLD.created_at = now() THEN
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

-- +goose Down
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
