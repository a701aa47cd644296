package clitest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/pgtest"
)

// TestPlantedNamesNeverResolve: on a ledger set up as docs/migrations.md
// says (the owner migrates with --grant-to and --effect-role; the runs
// connect as a login that owns nothing), with schema public writable by
// everyone (PostgreSQL 14's default), an overload of every catalog function
// runledger's SQL names and of every operator it uses, planted in public for
// every type it passes, and, by the runs' own effects, domains and views
// named like the catalog's types and relations in the worker's pg_temp:
// every command runledger has (migrate, run with an SQL effect, a query
// batch, static items, Supersede, a processor and its take-back, failures
// and their fromRun retry, items, key, verify, prune, migrate again) does exactly
// what it does without them, and none of them is ever called. Through
// PgBouncer (the suite's second pass) the runs share server connections,
// and with them whatever a session left there.
func TestPlantedNamesNeverResolve(t *testing.T) {
	t.Parallel()
	d := newTwoRoles(t)
	d.owner.exec(t, pgtest.TempTrapsSQL()+`
CREATE TABLE public.src AS SELECT 'acct-' || i AS entity, '2024-06' AS occurrence, pg_catalog.jsonb_build_object('amount', i) AS payload
    FROM pg_catalog.generate_series(1, 40) AS i;
CREATE TABLE public.sink (entity text NOT NULL CONSTRAINT not_bad CHECK (entity NOT LIKE 'bad-%'), occurrence text NOT NULL);
GRANT SELECT ON public.src TO `+d.role+`;
GRANT INSERT ON public.sink TO `+pgtest.EffectRole)
	planted := pgtest.PlantPublicTraps(t, d.owner.pool, pgtest.SQLCallNames(t, "../.."))
	require.Greater(t, planted, int64(1000), "the traps were planted")

	// The effect plants the pg_temp traps in the worker's session, then
	// writes the sink: no operator, function or cast of its own, so that
	// only runledger's statements could meet a trap.
	effect := `effect: {sql: "WITH p AS (SELECT public.plant_temp_traps()) INSERT INTO public.sink SELECT c.entity, c.occurrence FROM claimed AS c, p"}`
	var out []string
	cli := func(wantCode int, args ...string) result {
		t.Helper()
		r := runCLI(t, "", args...)
		out = append(out, r.stdout, r.stderr)
		require.Equal(t, wantCode, r.code, "runledger %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.stdout, r.stderr)
		require.NotContains(t, r.stdout+r.stderr, pgtest.Trapped, "runledger %s called a planted object", strings.Join(args, " "))
		return r
	}
	run := func(wantCode int, name string, spec ...string) summary {
		t.Helper()
		r := cli(wantCode, "run", "-f", writeFile(t, name+".yaml", manifest(name, spec...)), "--dsn", d.worker.dsn, "--output", "json", "--retry-timeout", "20s")
		return r.summary(t)
	}

	cli(0, "migrate", "--dsn", d.owner.dsn, "--grant-to", d.role, "--effect-role", pgtest.EffectRole)

	s := run(0, "first", `batch: {query: "SELECT entity, occurrence, payload FROM public.src"}`, effect, "workers: 2", "chunkSize: 7")
	require.Equal(t, counts{Total: 40, Completed: 40}, s.counts())

	var keys [][2]string
	for i := 36; i <= 45; i++ {
		keys = append(keys, [2]string{fmt.Sprintf("acct-%d", i), "2024-06"})
	}
	s = run(0, "second", inlineItems(keys...), effect, "chunkSize: 3")
	require.Equal(t, counts{Total: 10, Completed: 5, AlreadyHandled: 5}, s.counts())

	s = run(0, "third", inlineItems(keys[:3]...), effect, "onExisting: Supersede")
	require.Equal(t, counts{Total: 3, Completed: 3}, s.counts())

	// A processor that refuses one key: the Supersede run's claim of it is
	// taken back and the earlier row restored (runledger.ledger_take_back).
	proc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Items []struct{ Entity string } `json:"items"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		type res struct {
			OK    bool   `json:"ok"`
			Error string `json:"error,omitempty"`
		}
		var answer struct {
			Results []res `json:"results"`
		}
		for _, it := range req.Items {
			answer.Results = append(answer.Results, res{OK: it.Entity != "acct-4", Error: map[bool]string{true: "refused"}[it.Entity == "acct-4"]})
		}
		_ = json.NewEncoder(w).Encode(answer)
	}))
	t.Cleanup(proc.Close)
	charge := writeFile(t, "charge.yaml", manifest("charge", inlineItems([2]string{"acct-3", "2024-06"}, [2]string{"acct-4", "2024-06"}, [2]string{"new-1", "2024-06"}),
		"onExisting: Supersede", "maxFailedItems: 5", "effect:\n    processor: {image: example-processor, maxItemsPerCall: 2}"))
	r := cli(0, "run", "-f", charge,
		"--dsn", d.worker.dsn, "--output", "json", "--processor-url", proc.URL+"/process", "--retry-timeout", "20s")
	require.Equal(t, counts{Total: 3, Completed: 2, Failed: 1}, r.summary(t).counts(), "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)

	// Items the sink refuses fail; once it takes them, fromRun retries them.
	bad := inlineItems([2]string{"bad-1", "2024-06"}, [2]string{"ok-1", "2024-06"}, [2]string{"bad-2", "2024-06"})
	s = run(0, "june", bad, effect, "maxFailedItems: 5")
	require.Equal(t, counts{Total: 3, Completed: 1, Failed: 2}, s.counts())
	d.owner.exec(t, `ALTER TABLE public.sink DROP CONSTRAINT not_bad`)
	s = run(0, "june-retry", "batch: {fromRun: {name: june}}", effect)
	require.Equal(t, counts{Total: 2, Completed: 2}, s.counts())

	secondRun := writeFile(t, "second-again.yaml", manifest("second", inlineItems(keys...), effect, "chunkSize: 3"))
	for _, args := range [][]string{
		{"items", "first", "-n", "billing", "--output", "json"},
		{"items", "second", "-n", "billing", "--already-handled", "--output", "json", "-f", secondRun},
		{"items", "second", "-n", "billing", "--payload-changed", "--output", "json", "-f", secondRun},
		{"items", "june", "-n", "billing", "--failed", "--output", "jsonl"},
		{"items", "charge", "-n", "billing", "--output", "json"},
		{"key", "acct-3", "2024-06", "--output", "json"},
		{"key", "acct-4", "2024-06"},
		{"verify", "first", "-n", "billing", "--expect-completed", "40", "--expect-already-handled", "0", "--expect-failed", "0", "--expect-total", "40"},
		{"verify", "second", "-n", "billing", "-f", secondRun, "--expect-completed", "5", "--expect-already-handled", "5", "--expect-failed", "0", "--output", "json"},
		{"verify", "june", "-n", "billing", "-f", writeFile(t, "june.yaml", manifest("june", bad, effect, "maxFailedItems: 5")), "--expect-completed", "1", "--expect-already-handled", "0", "--expect-failed", "2", "--all"},
		{"verify", "charge", "-n", "billing", "-f", charge, "--expect-completed", "2", "--expect-already-handled", "0", "--expect-failed", "1", "--all"},
	} {
		cli(0, append(args, "--dsn", d.worker.dsn)...)
	}

	cli(0, "prune", "--superseded-older-than", "1ns", "--dsn", d.owner.dsn)
	cli(0, "prune", "--older-than", "1ns", "--dsn", d.owner.dsn)
	cli(0, "migrate", "--dsn", d.owner.dsn, "--grant-to", d.role, "--effect-role", pgtest.EffectRole)

	// Every effect ran once per committed row of an effect run, and every
	// key has one committed row.
	require.EqualValues(t, 40+5+3+1+2, d.owner.int(t, `SELECT pg_catalog.count(*) FROM public.sink`))
	require.EqualValues(t, 40+5+1+1+2, d.owner.committed(t))
	for _, o := range out {
		require.NotContains(t, o, pgtest.Trapped)
	}
}
