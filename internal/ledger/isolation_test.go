package ledger_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// noteItems are n items of entity "acct", whose payload names the account of
// their note: acct-<i>, or nobody-<i> for the positions in bad.
func noteItems(n int, bad ...int) []ledger.Item {
	out := make([]ledger.Item, n)
	for i := range out {
		account := fmt.Sprintf("acct-%d", i)
		if containsInt(bad, i) {
			account = fmt.Sprintf("nobody-%d", i)
		}
		out[i] = ledger.Item{
			Key:     ledger.Key{Entity: "acct", Occurrence: fmt.Sprintf("occ-%03d", i)},
			Payload: json.RawMessage(fmt.Sprintf(`{"account": %q}`, account)),
		}
	}
	return out
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

const noteEffect = `INSERT INTO notes (account, occurrence) SELECT payload->>'account', occurrence FROM claimed`

// requireOnlyBadFailed checks that exactly the items at bad failed, each with
// an error containing want, that every other item completed, and that the
// ledger and the effect's table hold exactly one row per completed item.
func requireOnlyBadFailed(t *testing.T, pool *pgxpool.Pool, chunk []ledger.Item, res []ledger.Result, want string, bad ...int) {
	t.Helper()
	require.Equal(t, tally{completed: len(chunk) - len(bad), failed: len(bad)}, count(res))
	for i, r := range res {
		if !containsInt(bad, i) {
			require.Equal(t, ledger.Completed, r.Outcome, "item %d is good: %v", i, r.Err)
			continue
		}
		require.Equal(t, ledger.Failed, r.Outcome, "item %d is bad", i)
		require.ErrorContains(t, r.Err, want, "item %d fails with its own error", i)
		require.ErrorContains(t, r.Err, chunk[i].String(), "the error names the item")
	}
	requireOneCommittedPerKey(t, pool, len(chunk)-len(bad))
	require.EqualValues(t, len(chunk)-len(bad), scalar[int64](t, pool, `SELECT count(*) FROM notes`), "one note per completed item")
	require.EqualValues(t, len(chunk)-len(bad), scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger`), "failed items left no ledger row")
}

// TestCommitChunk_DeferredForeignKeyIsIsolated: a DEFERRABLE INITIALLY
// DEFERRED foreign key is checked at COMMIT by default; the chunk makes it
// fire inside the chunk, so the bad items are isolated like with an immediate
// one, and the good ones commit once.
func TestCommitChunk_DeferredForeignKeyIsIsolated(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	mustExec(t, pool, `
CREATE TABLE accounts (id text PRIMARY KEY);
INSERT INTO accounts SELECT 'acct-' || i FROM generate_series(0, 39) i;
CREATE TABLE notes (
    account    text NOT NULL REFERENCES accounts DEFERRABLE INITIALLY DEFERRED,
    occurrence text PRIMARY KEY
);`)
	chunk := noteItems(40, 3, 29)
	res := commit(t, s, runNamed("run-a"), chunk, ledger.ChunkOptions{Effect: noteEffect})
	requireOnlyBadFailed(t, pool, chunk, res, `violates foreign key constraint "notes_account_fkey"`, 3, 29)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, res[3].Err, &pgErr)
	require.Equal(t, "23503", pgErr.Code)

	// Again by the same run: the good items are its own, the bad still fail.
	again := count(commit(t, s, runNamed("run-a"), chunk, ledger.ChunkOptions{Effect: noteEffect}))
	require.Equal(t, tally{completed: 38, sameRun: 38, failed: 2}, again)
	require.EqualValues(t, 38, scalar[int64](t, pool, `SELECT count(*) FROM notes`), "no effect ran twice")
}

// TestCommitChunk_DeferredConstraintTriggerIsIsolated: the same for a
// constraint trigger deferred to COMMIT.
func TestCommitChunk_DeferredConstraintTriggerIsIsolated(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	mustExec(t, pool, `
CREATE TABLE notes (account text NOT NULL, occurrence text PRIMARY KEY);
CREATE FUNCTION notes_known_account() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.account LIKE 'nobody-%' THEN
        RAISE EXCEPTION 'note % names unknown account %', NEW.occurrence, NEW.account USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER notes_known_account AFTER INSERT ON notes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION notes_known_account();`)
	chunk := noteItems(25, 0, 24)
	res := commit(t, s, runNamed("run-a"), chunk, ledger.ChunkOptions{Effect: noteEffect})
	requireOnlyBadFailed(t, pool, chunk, res, "names unknown account", 0, 24)
}
