-- +goose Up
-- THE RULE, its columns in the order (occurrence, entity). The same rule: a
-- unique index forbids the same set of duplicates whatever the order of its
-- columns, the filter is unchanged, and ON CONFLICT (entity, occurrence)
-- WHERE state = 'committed' infers it as before (inference matches the set
-- of columns). What changes is where a batch's keys land in it. A batch is
-- typically one new occurrence (a billing month, a day) for many existing
-- entities: entity first, its keys fall one per leaf page all over the index,
-- and on a ledger of 50 M rows every insert dirtied (and wrote to the WAL as
-- a full page image) a leaf of its own, so fresh runs went at 0.25x the rate
-- on an empty ledger (docs/scale.md); occurrence first, they are adjacent.
--
-- Built in this migration's transaction: the ledger takes no writes while it
-- runs (about a minute per 10 M rows on 2 cores, docs/scale.md), and the old
-- index guarantees the rule until the new one replaces it at commit.
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
