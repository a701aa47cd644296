-- +goose NO TRANSACTION
-- +goose Up
-- A run's rows by key (issue #20.3): within one run each key is processed at
-- most once, so a Supersede run asks, per key of its chunk, whether it has
-- ever committed the key (a row of the run in any state: its own committed
-- row, or one another Supersede run retired since). One probe of
-- (run_uid, occurrence, entity) per key answers it, whatever the size of the
-- run or the ledger; the rule's index holds committed rows only.
--
-- It replaces ledger_run_uid_idx (run_uid), whose queries (a run's or a
-- shard's rows) it serves as well through its first column, so each insert
-- still maintains three indexes.
--
-- Online: built CONCURRENTLY, outside a transaction, so writers go on while it
-- builds. It waits for every transaction older than itself (a running query
-- shard's batch cursor, say) before it completes; run it when no run is in
-- flight. A build interrupted leaves an invalid index behind, which the
-- first statement drops when the migration runs again.
DROP INDEX CONCURRENTLY IF EXISTS runledger.ledger_run_key_idx;
CREATE INDEX CONCURRENTLY ledger_run_key_idx ON runledger.ledger (run_uid, occurrence, entity);
DROP INDEX CONCURRENTLY IF EXISTS runledger.ledger_run_uid_idx;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS ledger_run_uid_idx ON runledger.ledger (run_uid);
DROP INDEX CONCURRENTLY IF EXISTS runledger.ledger_run_key_idx;
