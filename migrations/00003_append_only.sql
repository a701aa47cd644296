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

-- +goose Down
DROP TRIGGER ledger_append_only_truncate ON runledger.ledger;
DROP TRIGGER ledger_append_only ON runledger.ledger;
DROP FUNCTION runledger.ledger_append_only();
