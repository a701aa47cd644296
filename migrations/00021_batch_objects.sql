-- +goose NO TRANSACTION
-- +goose Up
-- A batch read from object storage (issue #47): its items are fixed in
-- runledger.batch like a query's rows, by the run's first shard, and the
-- header records what was read: source 'object', and in objects one entry
-- per object, in the order read ({"key", "size", "etag", "versionId",
-- "sha256"}), so that a later shard, retried pod or resumption tells an
-- object changed, added or removed since, and refuses the run.
--
-- Online: a nullable column without a default changes only the catalog;
-- the source rule is replaced NOT VALID in one statement (a brief lock, no
-- scan; the rule only widens) and validated in the next, which reads the
-- table without blocking writers. Each statement may run again after an
-- interruption.
ALTER TABLE runledger.batch_run ADD COLUMN IF NOT EXISTS objects jsonb;
ALTER TABLE runledger.batch_run
    DROP CONSTRAINT IF EXISTS batch_run_source_check,
    ADD CONSTRAINT batch_run_source_check CHECK (source IN ('query', 'static', 'object')) NOT VALID;
ALTER TABLE runledger.batch_run VALIDATE CONSTRAINT batch_run_source_check;

-- The logins `runledger migrate --grant-to` made workers set a header's item
-- count (00002): the objects read too (the first shard of an object batch
-- writes both), with no grant to run again.
-- +goose StatementBegin
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT p.grantee
        FROM information_schema.column_privileges AS p
        WHERE p.table_schema = 'runledger' AND p.table_name = 'batch_run'
          AND p.column_name = 'items' AND p.privilege_type = 'UPDATE'
          AND p.grantee <> current_user AND p.grantee <> 'PUBLIC'
    LOOP
        EXECUTE format('GRANT UPDATE (objects) ON runledger.batch_run TO %I', r.grantee);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
ALTER TABLE runledger.batch_run
    DROP CONSTRAINT IF EXISTS batch_run_source_check,
    ADD CONSTRAINT batch_run_source_check CHECK (source IN ('query', 'static')) NOT VALID;
ALTER TABLE runledger.batch_run DROP COLUMN IF EXISTS objects;
