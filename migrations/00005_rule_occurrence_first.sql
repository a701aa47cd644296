-- +goose Up
-- THE RULE, its columns in the order (occurrence, entity). The same rule: a
-- unique index forbids the same set of duplicates whatever the order of its
-- columns, the filter is unchanged, and ON CONFLICT (entity, occurrence)
-- WHERE state = 'committed' infers it as before (inference matches the set
-- of columns). What changes is where a batch's keys land in it: a batch is
-- typically one new occurrence (a month, a day) for many existing entities;
-- entity first, each key dirtied a leaf of its own all over the index, and a
-- grown ledger fell below half the empty ledger's rate (docs/scale.md).
--
-- Built in this migration's transaction: the ledger takes no reads or writes
-- while it runs (docs/scale.md gives the time per size), and the old index
-- guarantees the rule until the new one replaces it at commit.
--
-- The ledger is locked first, and waited for 5 s at most. Dropping the old
-- index needs the ledger to itself; asked for only after the build, that lock
-- would wait behind the open batch cursor of any running query-source shard
-- while the build's SHARE lock blocks that shard's own commits, so neither
-- would ever end, and every later reader would queue behind it too. Refused
-- instead, the migration fails (lock_not_available, retryable) and changes
-- nothing: run `runledger migrate` when no run is in flight.
-- +goose StatementBegin
DO $$
DECLARE
    wait_before text := current_setting('lock_timeout');
BEGIN
    PERFORM set_config('lock_timeout', '5s', true);
    LOCK TABLE runledger.ledger IN ACCESS EXCLUSIVE MODE;
    PERFORM set_config('lock_timeout', wait_before, true);
EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'migration 00005 rebuilds the ledger''s rule index and needs the ledger to itself, but a run is reading or writing it: nothing was changed; run runledger migrate when no run is in flight (docs/scale.md)'
        USING ERRCODE = 'lock_not_available';
END
$$;
-- +goose StatementEnd
ALTER INDEX runledger.ledger_business_key_uq RENAME TO ledger_business_key_uq_entity_first;
CREATE UNIQUE INDEX ledger_business_key_uq
    ON runledger.ledger (occurrence, entity)
    WHERE state = 'committed';
DROP INDEX runledger.ledger_business_key_uq_entity_first;

-- +goose Down
ALTER INDEX runledger.ledger_business_key_uq RENAME TO ledger_business_key_uq_occurrence_first;
CREATE UNIQUE INDEX ledger_business_key_uq
    ON runledger.ledger (entity, occurrence)
    WHERE state = 'committed';
DROP INDEX runledger.ledger_business_key_uq_occurrence_first;
