-- +goose Up
-- The ledger is append-only, enforced by the engine (issue #12). The only
-- change a row may ever see is committed -> superseded (state and
-- superseded_at, every other column unchanged): that is all the insert path
-- does (sqlSupersede). A committed row is never deleted, re-keyed, moved to
-- another run, given another payload, and a superseded row never comes back,
-- whoever asks (the table's owner and superusers included), so no effect and
-- no login can make a later run redo what a committed row records. The
-- worker's privileges (`runledger migrate --grant-to`) refuse most of this
-- first; this trigger is what holds when they do not (the owner's own login,
-- a role granted too much).
--
-- The one deletion allowed is deliberate clean-up of history: a superseded
-- row, deleted by a member of the table's owner role (`runledger prune
-- --superseded-older-than`). A worker login is no such member.
--
-- The error is a restrict_violation (23001) naming the constraint
-- ledger_append_only (ledger.AppendOnlyRule): a failure of the items whose
-- effect attempted it, never "already handled", never retried.
--
-- INSERT has no trigger on purpose: the insert path's cost stays that of
-- the index alone.
-- +goose StatementBegin
CREATE FUNCTION runledger.ledger_append_only() RETURNS trigger
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

CREATE TRIGGER ledger_append_only
    BEFORE UPDATE OR DELETE ON runledger.ledger
    FOR EACH ROW EXECUTE FUNCTION runledger.ledger_append_only();

CREATE TRIGGER ledger_append_only_truncate
    BEFORE TRUNCATE ON runledger.ledger
    FOR EACH STATEMENT EXECUTE FUNCTION runledger.ledger_append_only();

-- Superseding is how a key is reprocessed, never how it is forgotten: the
-- insert path supersedes a key's committed row only to commit a new one for
-- it in the same transaction. A key whose row was superseded must therefore
-- have a committed row when the transaction ends, or an effect (any login
-- that may supersede) could make a later run redo what a committed row
-- records. Deferred, because the new row is inserted after the old one is
-- superseded; the chunk checks it right after the effect (sqlAfterEffect).
-- +goose StatementBegin
CREATE FUNCTION runledger.ledger_superseded_replaced() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog
AS $$
BEGIN
    PERFORM FROM runledger.ledger AS l
    WHERE l.entity = NEW.entity AND l.occurrence = NEW.occurrence AND l.state = 'committed';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'runledger.ledger is append-only: the committed row % (%/% of run %) was superseded and no committed row replaces it',
                NEW.id, NEW.entity, NEW.occurrence, NEW.run_uid
            USING ERRCODE = 'restrict_violation', CONSTRAINT = 'ledger_append_only',
                  SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
                  DETAIL = 'A key is superseded only to commit a new row for it in the same transaction (onExisting: Supersede).';
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE CONSTRAINT TRIGGER ledger_superseded_replaced
    AFTER UPDATE ON runledger.ledger
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (OLD.state = 'committed' AND NEW.state = 'superseded')
    EXECUTE FUNCTION runledger.ledger_superseded_replaced();

-- +goose Down
DROP TRIGGER ledger_superseded_replaced ON runledger.ledger;
DROP FUNCTION runledger.ledger_superseded_replaced();
DROP TRIGGER ledger_append_only_truncate ON runledger.ledger;
DROP TRIGGER ledger_append_only ON runledger.ledger;
DROP FUNCTION runledger.ledger_append_only();
