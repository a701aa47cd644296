-- +goose NO TRANSACTION
-- +goose Up
-- runledger key reads a key's superseded rows and the runs that retired it
-- by key: without these indexes each of its reads was a scan of the ledger
-- (or of ledger_retired), bounded by the statement timeout and so refused
-- on a large ledger. The insert path never writes a superseded row (a
-- Supersede run's UPDATE of the row it retires does: one more index entry
-- on that path only); the rule's index stays the only one a claim probes.
--
-- Online: built CONCURRENTLY (no lock a running shard waits on; the build
-- waits for the transactions open when it starts, which a shard keeps short:
-- its batch cursor holds no snapshot). A build that failed leaves an invalid
-- index, dropped first when the migration runs again.
DROP INDEX CONCURRENTLY IF EXISTS runledger.ledger_superseded_key_idx;
CREATE INDEX CONCURRENTLY ledger_superseded_key_idx ON runledger.ledger (occurrence, entity)
    WHERE state = 'superseded';
DROP INDEX CONCURRENTLY IF EXISTS runledger.ledger_retired_key_idx;
-- run_uid last: a Supersede run's probe of its own retired key (the primary
-- key's, run_uid first) is one probe of this index too, whichever the
-- planner takes.
CREATE INDEX CONCURRENTLY ledger_retired_key_idx ON runledger.ledger_retired (occurrence, entity, run_uid);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS runledger.ledger_retired_key_idx;
DROP INDEX CONCURRENTLY IF EXISTS runledger.ledger_superseded_key_idx;
