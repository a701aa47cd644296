-- +goose Up
-- A failure record keeps its item's payload (issue #22: retry what failed),
-- so that a run with batch.fromRun takes the failed items of an earlier run
-- with their payloads, as the effect needs them. NULL: the item had no
-- payload, or (payload_digest set) one that could not be kept as text: not
-- valid UTF-8, a NUL, or over ledger.MaxFailurePayloadBytes (1 MiB, the
-- worker's limit: such an item failed as bad input and fails so again).
--
-- Online: a nullable column without a default is a change of the catalog
-- only (no table rewrite); the table is locked for that instant, waited for
-- 5 s at most.
SET LOCAL lock_timeout = '5s';
ALTER TABLE runledger.item_failure ADD COLUMN IF NOT EXISTS payload text;

-- The logins `runledger migrate --grant-to` made workers replace a
-- record's columns (00010): the payload too, with no grant to run again.
-- +goose StatementBegin
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT p.grantee
        FROM information_schema.column_privileges AS p
        WHERE p.table_schema = 'runledger' AND p.table_name = 'item_failure'
          AND p.column_name = 'payload_digest' AND p.privilege_type = 'UPDATE'
          AND p.grantee <> current_user AND p.grantee <> 'PUBLIC'
    LOOP
        EXECUTE format('GRANT UPDATE (payload) ON runledger.item_failure TO %I', r.grantee);
    END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
ALTER TABLE runledger.item_failure DROP COLUMN IF EXISTS payload;
