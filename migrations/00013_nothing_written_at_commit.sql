-- +goose Up
-- Nothing writes the ledger, a batch or a failure record while a
-- transaction commits.
--
-- PostgreSQL runs user code at COMMIT outside the effect's sandbox, as the
-- login: a deferred trigger an effect re-deferred (00007 refuses its writes:
-- it runs inside a trigger) and, after the deferred triggers, the rest of
-- every cursor declared WITH HOLD, whose query runs outside any trigger
-- (pg_trigger_depth() = 0). An effect, a trigger it left to COMMIT or a batch
-- query's function could so declare a cursor over a function that inserts
-- committed rows under an invented run, and make later items "already
-- handled" though nobody processed them (or erase failure records, 00010). runledger itself never writes
-- these tables at COMMIT (its deferred check, ledger_superseded_replaced,
-- only reads), so a write while the client's statement is a COMMIT (or END,
-- or PREPARE TRANSACTION) is user code's, and refused. Inside a trigger,
-- 00007's guard refuses it first; this one covers depth 0.
--
-- Statement-level triggers: one WHEN per statement, nothing per row.
-- Online: the tables are locked (SHARE ROW EXCLUSIVE, for CREATE TRIGGER)
-- only for this short transaction, waited for 5 s at most.
SET LOCAL lock_timeout = '5s';

-- +goose StatementBegin
CREATE FUNCTION runledger.ledger_not_at_commit() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'runledger.% is written by runledger only: % while the transaction commits refused (as %)', TG_TABLE_NAME, TG_OP, current_user
        USING ERRCODE = 'restrict_violation', CONSTRAINT = 'ledger_append_only',
              SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
              DETAIL = 'User code that runs at COMMIT (a cursor WITH HOLD) never writes the ledger, a batch or a failure record.';
END
$$;
-- +goose StatementEnd

CREATE TRIGGER ledger_not_at_commit
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.ledger
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() = 0
          AND pg_catalog.current_query() OPERATOR(pg_catalog.~*) '^\s*(commit|end|prepare\s+transaction)\M')
    EXECUTE FUNCTION runledger.ledger_not_at_commit();
CREATE TRIGGER batch_run_not_at_commit
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.batch_run
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() = 0
          AND pg_catalog.current_query() OPERATOR(pg_catalog.~*) '^\s*(commit|end|prepare\s+transaction)\M')
    EXECUTE FUNCTION runledger.ledger_not_at_commit();
CREATE TRIGGER batch_not_at_commit
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.batch
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() = 0
          AND pg_catalog.current_query() OPERATOR(pg_catalog.~*) '^\s*(commit|end|prepare\s+transaction)\M')
    EXECUTE FUNCTION runledger.ledger_not_at_commit();
CREATE TRIGGER item_failure_not_at_commit
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.item_failure
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() = 0
          AND pg_catalog.current_query() OPERATOR(pg_catalog.~*) '^\s*(commit|end|prepare\s+transaction)\M')
    EXECUTE FUNCTION runledger.ledger_not_at_commit();

-- The ledger's functions name pg_temp last in their search_path. Listing
-- only pg_catalog leaves the session's temporary schema searched first for
-- relations: ledger_append_only's owner check read pg_class there, so a
-- login granted DELETE by mistake could create a temporary pg_class naming
-- itself the ledger's owner and delete superseded history. (A later CREATE
-- OR REPLACE of one of them must keep this search_path.)
ALTER FUNCTION runledger.ledger_append_only() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION runledger.ledger_superseded_replaced() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION runledger.ledger_written_by_this_xact(bigint) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION runledger.ledger_take_back(text[], text[], bigint[]) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION runledger.ledger_not_from_trigger() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION runledger.ledger_record_retired() SET search_path = pg_catalog, pg_temp;

-- +goose Down
ALTER FUNCTION runledger.ledger_append_only() SET search_path = pg_catalog;
ALTER FUNCTION runledger.ledger_superseded_replaced() SET search_path = pg_catalog;
ALTER FUNCTION runledger.ledger_written_by_this_xact(bigint) SET search_path = pg_catalog;
ALTER FUNCTION runledger.ledger_take_back(text[], text[], bigint[]) SET search_path = pg_catalog;
ALTER FUNCTION runledger.ledger_not_from_trigger() SET search_path = pg_catalog;
ALTER FUNCTION runledger.ledger_record_retired() SET search_path = pg_catalog;
SET LOCAL lock_timeout = '5s';
DROP TRIGGER item_failure_not_at_commit ON runledger.item_failure;
DROP TRIGGER batch_not_at_commit ON runledger.batch;
DROP TRIGGER batch_run_not_at_commit ON runledger.batch_run;
DROP TRIGGER ledger_not_at_commit ON runledger.ledger;
DROP FUNCTION runledger.ledger_not_at_commit();
