package ledger_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// TestCommitChunk_RowLevelSecurityIsIsolated: a row-level security policy's
// WITH CHECK refuses some rows (SQLSTATE 42501, like a missing privilege, but
// it depends on the row): exactly those items fail, the others commit. A
// missing privilege on the table fails every item alike.
func TestCommitChunk_RowLevelSecurityIsIsolated(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	mustExec(t, pool, `
CREATE TABLE notes (account text NOT NULL, occurrence text PRIMARY KEY);
ALTER TABLE notes ENABLE ROW LEVEL SECURITY;
CREATE POLICY notes_known ON notes FOR ALL USING (true) WITH CHECK (account NOT LIKE 'nobody-%');
CREATE TABLE secrets (account text, occurrence text);
REVOKE ALL ON secrets FROM `+pgtest.EffectRole)
	app, _ := workerRole(t, pool)
	mustExec(t, pool, `GRANT SELECT, INSERT ON notes TO `+app.Config().ConnConfig.User)
	s := ledger.NewStore(app)

	chunk := noteItems(30, 7, 8, 20)
	res := commit(t, s, runNamed("run-a"), chunk, ledger.ChunkOptions{Effect: noteEffect})
	requireOnlyBadFailed(t, pool, chunk, res, `new row violates row-level security policy for table "notes"`, 7, 8, 20)

	// The effect's role may not write into secrets at all: every item fails with it.
	other := noteItems(5)
	for i := range other {
		other[i].Entity = "other"
	}
	res = commit(t, s, runNamed("run-a"), other, ledger.ChunkOptions{Effect: `INSERT INTO secrets SELECT payload->>'account', occurrence FROM claimed`})
	require.Equal(t, tally{failed: 5}, count(res))
	for _, r := range res {
		require.ErrorContains(t, r.Err, "permission denied for table secrets")
	}
	require.Zero(t, scalar[int64](t, pool, `SELECT count(*) FROM runledger.ledger WHERE entity = 'other'`))
}
