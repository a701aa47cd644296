package ledger_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
)

type record struct {
	Entity, Occurrence, Pass string
	Chunk, Items             int
	Class, Error             string
}

func records(t *testing.T, pool *pgxpool.Pool, uid string) []record {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT entity, occurrence, pass, chunk, items, class, error
FROM runledger.item_failure WHERE run_uid = $1 ORDER BY entity, occurrence`, uid)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[record])
	require.NoError(t, err)
	return out
}

func failedItem(entity, class, msg string) ledger.FailedItem {
	return ledger.FailedItem{Key: ledger.Key{Entity: entity, Occurrence: "o"}, Class: class, Error: msg}
}

// TestRecordVerdicts: one record per key, its copies counted; the same chunk
// recorded again (a try whose answer was lost) changes nothing; a later
// chunk of the same pass adds its copies; a later pass replaces a record,
// and forgets the records of the keys it settled otherwise, never its own.
func TestRecordVerdicts(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	ctx := context.Background()
	p1 := ledger.Pass{Run: runNamed("uid-r"), ID: "p1"}

	chunk1 := []ledger.FailedItem{failedItem("a", "23503", "no account"), failedItem("a", "23503", "repeat of a failed item: no account"), failedItem("b", ledger.ClassInput, "blank")}
	require.NoError(t, s.RecordVerdicts(ctx, p1, 1, chunk1, nil))
	require.NoError(t, s.RecordVerdicts(ctx, p1, 1, chunk1, nil), "the same chunk again")
	require.Equal(t, []record{{"a", "o", "p1", 1, 2, "23503", "no account"}, {"b", "o", "p1", 1, 1, "input", "blank"}}, records(t, pool, "uid-r"))
	// Its last key's repeats continue in chunk 2.
	require.NoError(t, s.RecordVerdicts(ctx, p1, 2, []ledger.FailedItem{failedItem("b", ledger.ClassInput, "repeat of a failed item: blank")}, []ledger.Key{{Entity: "a", Occurrence: "o"}}))
	require.Equal(t, []record{{"a", "o", "p1", 1, 2, "23503", "no account"}, {"b", "o", "p1", 2, 2, "input", "blank"}}, records(t, pool, "uid-r"),
		"the copies added, the first error kept; a key of this pass is never forgotten by it")

	// A later pass: a fails otherwise, b completed, c fails.
	p2 := ledger.Pass{Run: runNamed("uid-r"), ID: "p2"}
	require.NoError(t, s.RecordVerdicts(ctx, p2, 1, []ledger.FailedItem{failedItem("a", ledger.ClassProcessorRefused, "declined"), failedItem("c", "22P02", "bad json")},
		[]ledger.Key{{Entity: "b", Occurrence: "o"}}))
	require.Equal(t, []record{{"a", "o", "p2", 1, 1, "processor-refused", "declined"}, {"c", "o", "p2", 1, 1, "22P02", "bad json"}}, records(t, pool, "uid-r"))
	has, err := s.RunHasFailures(ctx, "uid-r")
	require.NoError(t, err)
	require.True(t, has)
	require.NoError(t, s.RecordVerdicts(ctx, ledger.Pass{Run: runNamed("uid-r"), ID: "p3"}, 1, nil, []ledger.Key{{Entity: "a", Occurrence: "o"}, {Entity: "c", Occurrence: "o"}}))
	require.Empty(t, records(t, pool, "uid-r"))
	has, err = s.RunHasFailures(ctx, "uid-r")
	require.NoError(t, err)
	require.False(t, has)
}

// TestRecordVerdicts_Bounds: the error text is cut to MaxFailureErrorBytes at
// a character boundary; a bad row's key that PostgreSQL cannot hold as it
// came (NUL, invalid UTF-8, too long) is kept as valid text within the key
// part's limit, and two that become the same key make one record.
func TestRecordVerdicts_Bounds(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := ledger.NewStore(pool)
	ctx := context.Background()
	long := strings.Repeat("é", 2000) // 4000 bytes
	require.NoError(t, s.RecordVerdicts(ctx, ledger.Pass{Run: runNamed("uid-b"), ID: "p"}, 1, []ledger.FailedItem{
		{Key: ledger.Key{Entity: "acct\x00", Occurrence: "o\xff"}, Class: ledger.ClassInput, Error: "nul\x00 and \xff"},
		{Key: ledger.Key{Entity: "acct\x00", Occurrence: "o\xfe"}, Class: ledger.ClassInput, Error: "another"},
		{Key: ledger.Key{Entity: long, Occurrence: "o"}, Class: ledger.ClassInput, Error: long},
	}, nil))
	recs := records(t, pool, "uid-b")
	require.Len(t, recs, 2)
	require.Equal(t, record{"acct\uFFFD", "o\uFFFD", "p", 1, 2, "input", "nul\uFFFD and \uFFFD"}, recs[0])
	require.LessOrEqual(t, len(recs[1].Entity), v1alpha1.MaxKeyPartBytes)
	require.True(t, strings.HasSuffix(recs[1].Entity, "…"))
	require.LessOrEqual(t, len(recs[1].Error), ledger.MaxFailureErrorBytes)
	require.Greater(t, len(recs[1].Error), ledger.MaxFailureErrorBytes-4)
	require.True(t, utf8.ValidString(recs[1].Error))
	require.True(t, strings.HasPrefix(long, strings.TrimSuffix(recs[1].Error, "…")))
	require.Equal(t, ledger.CutError("short"), "short")
}

// TestSandbox_EffectCannotForgeOrEraseFailureRecords: an effect may neither
// write a failure record nor delete one, directly (the effect role has no
// privilege on schema runledger) or from a trigger left to fire at COMMIT
// as the worker's login (refused from inside a trigger): every item of its
// chunk fails, and the records are as they were.
func TestSandbox_EffectCannotForgeOrEraseFailureRecords(t *testing.T) {
	t.Parallel()
	owner := newPool(t)
	worker, _ := workerRole(t, owner)
	ctx := context.Background()
	require.NoError(t, ledger.NewStore(worker).RecordVerdicts(ctx, ledger.Pass{Run: runNamed("victim"), ID: "p"}, 1,
		[]ledger.FailedItem{failedItem("acct-1", "23503", "no account")}, nil), "the worker login writes records")
	before := records(t, owner, "victim")
	const forge = `INSERT INTO runledger.item_failure (run_uid, entity, occurrence, run_namespace, run_name, shard, attempt, pass, chunk, items, class, error)
VALUES ('victim', 'acct-2', 'o', 'default', 'victim', 0, 0, 'forged', 1, 1, 'input', 'forged')`
	const erase = `DELETE FROM runledger.item_failure WHERE run_uid = 'victim'`
	mustExec(t, owner, `
CREATE TABLE sink (entity text, occurrence text);
CREATE TABLE relay (x int);
CREATE FUNCTION forge_failure() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN `+forge+`; RETURN NULL; END $$;
CREATE FUNCTION erase_failures() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN `+erase+`; RETURN NULL; END $$;
CREATE FUNCTION redefer() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN SET CONSTRAINTS ALL DEFERRED; INSERT INTO relay VALUES (1); RETURN NULL; END $$`)
	for _, tt := range []struct{ name, setup, effect, want string }{
		{"forges directly", ``, forge, "permission denied for schema runledger"},
		{"erases directly", ``, erase, "permission denied for schema runledger"},
		{"forges at COMMIT", `forge_failure`, `INSERT INTO sink SELECT entity, occurrence FROM claimed`, "from inside a trigger refused"},
		{"erases at COMMIT", `erase_failures`, `INSERT INTO sink SELECT entity, occurrence FROM claimed`, "from inside a trigger refused"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.setup != "" {
				mustExec(t, owner, `DROP TRIGGER IF EXISTS at_commit ON relay; DROP TRIGGER IF EXISTS deferred ON sink;
CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON relay DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+tt.setup+`();
CREATE CONSTRAINT TRIGGER deferred AFTER INSERT ON sink DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION redefer()`)
			}
			res := commit(t, ledger.NewStore(worker), runNamed("forger"), items("mal", 0, 4), ledger.ChunkOptions{Effect: tt.effect})
			require.Equal(t, tally{failed: 4}, count(res))
			for _, r := range res {
				require.ErrorContains(t, r.Err, tt.want)
			}
			require.Equal(t, before, records(t, owner, "victim"), "the records are as they were")
			require.Zero(t, scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger WHERE entity = 'mal'`), "nothing of the chunk committed")
		})
	}
}
