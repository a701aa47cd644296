-- +goose NO TRANSACTION
-- +goose Up
-- A run's rows by shard (issue #44): before a shard reports success the
-- ledger proves its counts, and when its server kept the same life through
-- the pass it counts the shard's own rows (ledger.ProveShard). By run_uid
-- alone that count read every shard's rows of the run, each shard's proof
-- O(run) and a run's O(run x shards); (run_uid, shard) makes it O(shard).
-- It replaces ledger_run_uid_idx, a prefix of it: every reader by run_uid
-- alone is served the same, and a claim writes no more index entries.
--
-- Online: built and dropped CONCURRENTLY (no lock a running shard waits
-- on; the build waits for the transactions open when it starts, which a
-- shard keeps short). A build that failed leaves an invalid index, dropped
-- first when the migration runs again; the old index goes only once the
-- new one is built.
DROP INDEX CONCURRENTLY IF EXISTS runledger.ledger_run_shard_idx;
CREATE INDEX CONCURRENTLY ledger_run_shard_idx ON runledger.ledger (run_uid, shard);
DROP INDEX CONCURRENTLY IF EXISTS runledger.ledger_run_uid_idx;

-- +goose Down
CREATE INDEX CONCURRENTLY IF NOT EXISTS ledger_run_uid_idx ON runledger.ledger (run_uid);
DROP INDEX CONCURRENTLY IF EXISTS runledger.ledger_run_shard_idx;
