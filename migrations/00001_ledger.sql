-- +goose Up
-- The ledger: one row per committed (or superseded) logical occurrence.
--
-- The business key is (entity, occurrence). The guarantee of runledger is the
-- filtered unique index below, not any check in Go: PostgreSQL refuses a second
-- committed row for a key, whoever writes it. Superseded rows are history and
-- deliberately fall outside the filter, so deliberate reprocessing can commit a
-- new row for a key whose old row was superseded.
CREATE TABLE runledger.ledger (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entity         text        NOT NULL CHECK (entity <> ''),
    occurrence     text        NOT NULL CHECK (occurrence <> ''),
    state          text        NOT NULL DEFAULT 'committed'
                   CONSTRAINT ledger_state_check CHECK (state IN ('committed', 'superseded')),
    run_namespace  text        NOT NULL,
    run_name       text        NOT NULL,
    run_uid        text        NOT NULL,
    shard          integer     NOT NULL CHECK (shard >= 0),
    attempt        integer     NOT NULL CHECK (attempt >= 0),
    payload        jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    superseded_at  timestamptz,
    CONSTRAINT ledger_superseded_at_check
        CHECK ((state = 'superseded') = (superseded_at IS NOT NULL))
);

-- THE RULE. Its name is the constant ledger.BusinessKeyIndex; the classifier
-- recognises a violation of exactly this index as "already handled", and a test
-- reads this definition back from the catalog so the two cannot drift apart.
CREATE UNIQUE INDEX ledger_business_key_uq
    ON runledger.ledger (entity, occurrence)
    WHERE state = 'committed';

-- Counting a run's rows (status reconciliation, tests, operators' queries).
CREATE INDEX ledger_run_uid_idx ON runledger.ledger (run_uid);

-- +goose Down
DROP TABLE runledger.ledger;
