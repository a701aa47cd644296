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
-- Built in this migration's transaction: the ledger takes no writes while it
-- runs (docs/scale.md gives the time per size), and the old index
-- guarantees the rule until the new one replaces it at commit.
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
