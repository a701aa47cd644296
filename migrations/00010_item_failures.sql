-- +goose NO TRANSACTION
-- +goose Up
-- Every failed item of a run, kept (issue #22): which items failed and why,
-- so that no failure is known only to a log. One row per run and key: the
-- item's current verdict in that run. The worker writes it after each chunk
-- that counted failures (ledger.Store.RecordVerdicts), in one statement
-- only when there is something to write; a later pass of the run (an
-- attempt, a rerun of `runledger run`) that settles the key otherwise
-- (completed, already handled) deletes its row, and one that fails it again
-- replaces it. `runledger prune --older-than` deletes a pruned run's rows.
--
-- items counts the copies of the key the pass counted failed (its first
-- copy and its repeats in the batch): the sum of a run's items is its
-- status' failed count. pass names the shard's processing that wrote the
-- row (a random id per start of a shard) and chunk the chunk of that pass:
-- a chunk sent again (its answer lost) replaces its own count, a later
-- chunk of the same pass adds to it (a key whose repeats span two chunks),
-- another pass replaces it.
--
-- error is the item's error cut to ledger.MaxFailureErrorBytes (1024) bytes,
-- valid UTF-8; class is its SQLSTATE (five characters) or a class of
-- runledger's (ledger.FailureClass: input, processor-refused, ...);
-- payload_digest the SHA-256 (hex) of the payload as the source gave it,
-- NULL without one. A key that could not be stored as it came (a NULL, a
-- part too long) is kept as valid UTF-8 text, cut to the key part's limit.
--
-- Online: a new table; the ledger is not locked. Each statement commits on
-- its own and may run again after an interruption.
CREATE TABLE IF NOT EXISTS runledger.item_failure (
    run_uid        text        NOT NULL,
    entity         text        NOT NULL,
    occurrence     text        NOT NULL,
    run_namespace  text        NOT NULL,
    run_name       text        NOT NULL,
    shard          integer     NOT NULL CHECK (shard >= 0),
    attempt        integer     NOT NULL CHECK (attempt >= 0),
    pass           text        NOT NULL,
    chunk          integer     NOT NULL,
    items          integer     NOT NULL CHECK (items >= 1),
    payload_digest text        CHECK (payload_digest ~ '^[0-9a-f]{64}$'),
    class          text        NOT NULL CHECK (class <> ''),
    error          text        NOT NULL CHECK (octet_length(error) <= 1024),
    failed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_uid, entity, occurrence)
);

-- Like the ledger and the batches (00007): no statement issued from inside a
-- trigger writes it, so no effect, and no trigger an effect leaves to fire
-- at COMMIT as the worker's login, forges or erases a failure record. (The
-- effect role itself has no privilege on schema runledger.)
DROP TRIGGER IF EXISTS item_failure_not_from_trigger ON runledger.item_failure;
CREATE TRIGGER item_failure_not_from_trigger
    BEFORE INSERT OR UPDATE OR DELETE ON runledger.item_failure
    FOR EACH STATEMENT
    WHEN (pg_catalog.pg_trigger_depth() > 0)
    EXECUTE FUNCTION runledger.ledger_not_from_trigger();

-- `runledger key`: a key's failure records in every run.
CREATE INDEX IF NOT EXISTS item_failure_key_idx ON runledger.item_failure (occurrence, entity);

-- +goose Down
DROP TABLE IF EXISTS runledger.item_failure;
