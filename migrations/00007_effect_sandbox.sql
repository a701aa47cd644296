-- +goose Up
-- The effect's sandbox (issue #20): user code never writes the ledger, and
-- PostgreSQL, not a convention, keeps it out.
--
-- 1. An SQL effect runs inside runledger.run_effect, a SECURITY DEFINER
--    function that `runledger migrate --effect-role ROLE` gives to ROLE: an
--    unprivileged role with no privilege on schema runledger (the worker
--    checks that at start and refuses to run an effect otherwise). Inside a
--    SECURITY DEFINER function PostgreSQL refuses SET ROLE, RESET ROLE,
--    set_config('role', ...) and SET SESSION AUTHORIZATION, so the effect
--    cannot switch back to the worker's login. It sets no search_path on
--    purpose: the effect's names resolve as its author wrote them, and
--    whatever they resolve to runs as ROLE. Until --effect-role is given the
--    function belongs to the migrator and no worker runs an effect.
--
--    The function fires the effect's deferred constraints itself (SET
--    CONSTRAINTS ALL IMMEDIATE), so a deferred constraint trigger of a table
--    the effect wrote runs as ROLE too, not as the worker at COMMIT.
--
-- 2. Nobody but the worker takes claims back: ledger_take_back was
--    executable by PUBLIC (it only ever touches the caller's own
--    transaction's rows, which is exactly an effect's own chunk).
--    `runledger migrate --grant-to` grants it to the worker.
--
-- 3. ledger_superseded_replaced now fires inside run_effect (as ROLE, who
--    may not read the ledger): it runs as its owner.
--
-- 4. No statement issued from inside a trigger writes the ledger or a batch.
--    The insert path's statements are top-level statements
--    (pg_trigger_depth() = 0, also inside ledger_take_back); user code can
--    only ever run as the worker from a trigger (an effect that re-defers a
--    constraint from inside a trigger that run_effect fires leaves it to fire
--    at COMMIT, as the worker), and there it is refused. Statement-level
--    triggers: one WHEN per statement, nothing per row.
--
-- Online: the ledger is locked (SHARE ROW EXCLUSIVE, for CREATE TRIGGER)
-- only for this short transaction, waited for 5 s at most.
SET LOCAL lock_timeout = '5s';

-- +goose StatementBegin
CREATE FUNCTION runledger.run_effect(effect text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
AS $$
BEGIN
    EXECUTE effect;
    SET CONSTRAINTS ALL IMMEDIATE;
END
$$;
-- +goose StatementEnd
REVOKE ALL ON FUNCTION runledger.run_effect(text) FROM PUBLIC;

REVOKE ALL ON FUNCTION runledger.ledger_take_back(text[], text[], bigint[]) FROM PUBLIC;

ALTER FUNCTION runledger.ledger_superseded_replaced() SECURITY DEFINER;

-- +goose StatementBegin
CREATE FUNCTION runledger.ledger_not_from_trigger() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog
AS $$
BEGIN
    RAISE EXCEPTION 'runledger.% is written by runledger only: % from inside a trigger refused (as %)', TG_TABLE_NAME, TG_OP, current_user
        USING ERRCODE = 'restrict_violation', CONSTRAINT = 'ledger_append_only',
              SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
              DETAIL = 'User code (an effect, a trigger it fires) never writes the ledger or a batch.';
END
$$;
-- +goose StatementEnd

CREATE TRIGGER ledger_not_from_trigger
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.ledger
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() > 0)
    EXECUTE FUNCTION runledger.ledger_not_from_trigger();
CREATE TRIGGER batch_run_not_from_trigger
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.batch_run
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() > 0)
    EXECUTE FUNCTION runledger.ledger_not_from_trigger();
CREATE TRIGGER batch_not_from_trigger
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.batch
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() > 0)
    EXECUTE FUNCTION runledger.ledger_not_from_trigger();

-- +goose Down
SET LOCAL lock_timeout = '5s';
DROP TRIGGER batch_not_from_trigger ON runledger.batch;
DROP TRIGGER batch_run_not_from_trigger ON runledger.batch_run;
DROP TRIGGER ledger_not_from_trigger ON runledger.ledger;
DROP FUNCTION runledger.ledger_not_from_trigger();
ALTER FUNCTION runledger.ledger_superseded_replaced() SECURITY INVOKER;
GRANT EXECUTE ON FUNCTION runledger.ledger_take_back(text[], text[], bigint[]) TO PUBLIC;
DROP FUNCTION runledger.run_effect(text);
