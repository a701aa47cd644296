package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// TestKeyLookupsProbeTheRuleIndex: the statements that look up committed rows
// by key (the fast path's lookup, the attribution of skipped keys and the
// preload, supersede) must probe the rule's index once per key, whatever the
// planner believes about the ledger: a plan that scans the ledger per chunk
// costs as much as the table is large, and one that scans it per key (chosen
// for an empty ledger) is quadratic while concurrent writers fill it.
func TestKeyLookupsProbeTheRuleIndex(t *testing.T) {
	t.Parallel()
	// A chunk's worth of keys: half held in the populated ledger, half not.
	var entities, occurrences, payloads []string
	for i := 1; i <= 12000; i += 2 {
		entities = append(entities, fmt.Sprintf("acct-%d", i%1000))
		occurrences = append(occurrences, fmt.Sprintf("occ-%d", i*5))
		payloads = append(payloads, `{"amount": 1}`)
	}
	run := []any{"default", "run", "run-uid", 0, 0}
	statements := []struct {
		name string
		sql  string
		args []any
	}{
		{"claim", ledger.SQLClaim, append([]any{entities, occurrences, payloads}, run...)},
		{"holders", ledger.SQLHolders, []any{entities, occurrences}},
		{"supersede", ledger.SQLSupersede, []any{entities, occurrences, "other-run"}},
	}
	for _, ledgerRows := range []int{0, 60000} {
		t.Run(fmt.Sprintf("ledger of %d rows", ledgerRows), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := newPool(t)
			_, err := pool.Exec(ctx, `
INSERT INTO runledger.ledger (entity, occurrence, run_namespace, run_name, run_uid, shard, attempt)
SELECT 'acct-' || (i % 1000), 'occ-' || i, 'default', 'big', 'big-run', 0, 0
FROM generate_series(1, $1) AS i`, ledgerRows)
			require.NoError(t, err)
			_, err = pool.Exec(ctx, `VACUUM ANALYZE runledger.ledger`)
			require.NoError(t, err)

			for _, st := range statements {
				t.Run(st.name, func(t *testing.T) {
					// As the insert path runs them: in a transaction that
					// leaves the planner no sequential scan.
					tx, err := pool.Begin(ctx)
					require.NoError(t, err)
					defer func() { _ = tx.Rollback(ctx) }()
					_, err = tx.Exec(ctx, ledger.SQLIndexProbesOnly)
					require.NoError(t, err)
					rows, err := tx.Query(ctx, "EXPLAIN "+st.sql, st.args...)
					require.NoError(t, err)
					lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
					require.NoError(t, err)
					plan := strings.Join(lines, "\n")
					require.NotContains(t, plan, "Seq Scan on ledger", "the lookup must not scan the ledger:\n%s", plan)
					require.Contains(t, plan, "Index Scan using "+ledger.BusinessKeyIndex,
						"the lookup must probe the rule's index per key:\n%s", plan)
				})
			}
		})
	}
}
