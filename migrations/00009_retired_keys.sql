-- +goose NO TRANSACTION
-- +goose Up
-- A run's retired keys (issue #20.3): within one run each key is processed at
-- most once, so a Supersede run asks, per key of its chunk, whether it has
-- ever committed the key: its committed row (the rule's index answers), or a
-- row of it another Supersede run retired since, which this table records.
-- One probe of its primary key per key answers that, whatever the size of
-- the run or the ledger; no index of the ledger covers superseded rows by key.
--
-- The engine writes it, not the insert path: a trigger records every
-- committed -> superseded change, whoever makes it (SECURITY DEFINER: a
-- worker login may read the table, never write it). Pruning superseded rows
-- leaves their entries: the run did process the key.
--
-- Online: no index of the ledger is built, and the ledger is locked only
-- for CREATE TRIGGER (SHARE ROW EXCLUSIVE, waited for 5 s at most, released
-- at once: each statement of this migration commits on its own). The
-- history is recorded after the trigger exists, so no supersede is missed.
CREATE TABLE IF NOT EXISTS runledger.ledger_retired (
    run_uid    text NOT NULL,
    occurrence text NOT NULL,
    entity     text NOT NULL,
    PRIMARY KEY (run_uid, occurrence, entity)
);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION runledger.ledger_record_retired() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog
AS $$
BEGIN
    INSERT INTO runledger.ledger_retired (run_uid, occurrence, entity)
    VALUES (OLD.run_uid, OLD.occurrence, OLD.entity)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $$
BEGIN
    PERFORM set_config('lock_timeout', '5s', true);
    DROP TRIGGER IF EXISTS ledger_record_retired ON runledger.ledger;
    CREATE TRIGGER ledger_record_retired
        AFTER UPDATE ON runledger.ledger
        FOR EACH ROW
        WHEN (OLD.state = 'committed' AND NEW.state = 'superseded')
        EXECUTE FUNCTION runledger.ledger_record_retired();
END
$$;
-- +goose StatementEnd

INSERT INTO runledger.ledger_retired (run_uid, occurrence, entity)
SELECT run_uid, occurrence, entity FROM runledger.ledger WHERE state = 'superseded'
ON CONFLICT DO NOTHING;

-- +goose Down
DROP TRIGGER IF EXISTS ledger_record_retired ON runledger.ledger;
DROP FUNCTION IF EXISTS runledger.ledger_record_retired();
DROP TABLE IF EXISTS runledger.ledger_retired;
