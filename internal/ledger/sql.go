package ledger

// All SQL of the ledger lives here. Arrays travel as text[]; payloads are cast
// to jsonb by the server, so a malformed payload fails in PostgreSQL (22P02)
// and is isolated like any other bad item.

// The arbiter of every insert names the business-key rule by its columns and
// predicate: (entity, occurrence) WHERE state = 'committed'. PostgreSQL infers
// exactly the partial unique index ledger_business_key_uq from it, so only
// conflicts with that rule are absorbed by DO NOTHING; a violation of any other
// constraint still raises. (`ON CONFLICT ON CONSTRAINT ledger_business_key_uq`
// is not an alternative: a partial unique index is not a constraint, and
// PostgreSQL rejects the statement.)
const arbiter = `ON CONFLICT (entity, occurrence) WHERE state = 'committed' DO NOTHING`

// sqlInsert claims the chunk's items: $1 entities, $2 occurrences, $3 payloads
// (text, NULL allowed), $4..$8 the run's identity. It returns the keys it
// inserted; a key it did not return is held by a committed row already.
const sqlInsert = `
INSERT INTO runledger.ledger
    (entity, occurrence, state, run_namespace, run_name, run_uid, shard, attempt, payload)
SELECT k.entity, k.occurrence, 'committed', $4, $5, $6, $7, $8, k.payload::jsonb
FROM unnest($1::text[], $2::text[], $3::text[]) AS k(entity, occurrence, payload)
` + arbiter + `
RETURNING entity, occurrence`

// sqlInsertClaimed is sqlInsert that also copies the newly claimed items into
// the session's temporary table "claimed", which the caller's effect reads.
const sqlInsertClaimed = `
WITH ins AS (
    INSERT INTO runledger.ledger
        (entity, occurrence, state, run_namespace, run_name, run_uid, shard, attempt, payload)
    SELECT k.entity, k.occurrence, 'committed', $4, $5, $6, $7, $8, k.payload::jsonb
    FROM unnest($1::text[], $2::text[], $3::text[]) AS k(entity, occurrence, payload)
    ` + arbiter + `
    RETURNING entity, occurrence, payload
)
INSERT INTO pg_temp.claimed (entity, occurrence, payload)
SELECT entity, occurrence, payload FROM ins
RETURNING entity, occurrence`

// sqlCreateClaimed makes the per-session table the effect reads. ON COMMIT
// DELETE ROWS empties it at every commit; sqlClearClaimed empties it between
// the sub-chunks of one transaction.
const (
	sqlCreateClaimed = `CREATE TEMP TABLE IF NOT EXISTS claimed (
    entity     text  NOT NULL,
    occurrence text  NOT NULL,
    payload    jsonb
) ON COMMIT DELETE ROWS`
	sqlClearClaimed = `DELETE FROM pg_temp.claimed`
)

// sqlSupersede marks the committed rows of the given keys superseded, except
// rows this same run committed (an earlier attempt of this run already did the
// reprocessing). It runs in the chunk's transaction right before the insert,
// so the old row is retired and the new one committed atomically.
const sqlSupersede = `
UPDATE runledger.ledger AS l
SET state = 'superseded', superseded_at = now()
FROM unnest($1::text[], $2::text[]) AS k(entity, occurrence)
WHERE l.entity = k.entity AND l.occurrence = k.occurrence
  AND l.state = 'committed' AND l.run_uid <> $3
RETURNING l.entity, l.occurrence`

// sqlHolders says which committed rows hold the given keys, and whose they are.
// It serves both the preload and the attribution of keys the insert skipped.
const sqlHolders = `
SELECT l.entity, l.occurrence, l.run_uid
FROM unnest($1::text[], $2::text[]) AS k(entity, occurrence)
JOIN runledger.ledger AS l
  ON l.entity = k.entity AND l.occurrence = k.occurrence AND l.state = 'committed'`
