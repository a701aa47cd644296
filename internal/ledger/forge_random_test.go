package ledger_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// forgeSeedEnv replays TestForging_Randomized: the seed it printed.
const forgeSeedEnv = "RUNLEDGER_FORGE_SEED"

// forgeCodes is one SQLSTATE of every class PostgreSQL defines (and every
// integrity-constraint violation), each raised by user code with the
// ledger's index, schema and table names in every field a RAISE can set.
var forgeCodes = []string{
	"01000", "02000", "03000", "08000", "08006", "09000", "0A000", "0B000", "0F000", "0L000", "0P000", "0Z000",
	"20000", "21000", "22000", "22012", "22P02", "23000", "23001", "23502", "23503", "23505", "23514", "23P01",
	"24000", "25000", "25006", "26000", "27000", "28000", "2B000", "2D000", "2F000", "34000", "38000", "39000",
	"3B000", "3D000", "3F000", "40000", "40001", "40P01", "42000", "42501", "42601", "42P01", "44000", "53000",
	"53300", "54000", "55000", "55P03", "57000", "57014", "57P01", "58000", "72000", "F0000", "HV000", "P0000",
	"P0001", "XX000",
}

// The points where user code runs, and where it raises.
const (
	pointEffect   = "effect"   // the effect's own statement
	pointTrigger  = "trigger"  // a trigger on a table the effect writes
	pointDeferred = "deferred" // a deferred constraint trigger of that table
	pointClaimed  = "claimed"  // a trigger the effect installs on "claimed"
)

var forgePoints = []string{pointEffect, pointTrigger, pointDeferred, pointClaimed}

// forgeSchema: forge_keys says which key raises which SQLSTATE at which
// point; forge() raises it with every settable field naming the ledger's
// rule. effects records each run's effect per key.
const forgeSchema = `
CREATE TABLE public.forge_keys (point text, entity text, occurrence text, code text, PRIMARY KEY (point, entity, occurrence));
CREATE SEQUENCE public.forge_retry;
CREATE TABLE public.forge_retry_budget (n bigint);
CREATE FUNCTION public.forge(p text, e text, o text) RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c text;
BEGIN
    SELECT k.code INTO c FROM public.forge_keys AS k WHERE k.point = p AND k.entity = e AND k.occurrence = o;
    IF c IS NULL THEN
        RETURN;
    END IF;
    IF (left(c, 2) IN ('08', '40') OR left(c, 2) = '57' OR c IN ('53300', '55P03'))
       AND nextval('public.forge_retry') > (SELECT b.n FROM public.forge_retry_budget AS b) THEN
        RETURN; -- retryable codes: a bounded number of times in all
    END IF;
    RAISE EXCEPTION USING ERRCODE = c,
        MESSAGE = format('duplicate key value violates unique constraint "ledger_business_key_uq" (%s at %s)', c, p),
        DETAIL = format('Key (occurrence, entity)=(%s, %s) already exists.', o, e),
        HINT = 'runledger.ledger ledger_business_key_uq',
        CONSTRAINT = 'ledger_business_key_uq', SCHEMA = 'runledger', TABLE = 'ledger',
        COLUMN = 'entity', DATATYPE = 'text';
END
$$;
CREATE FUNCTION public.forge_row() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM public.forge(TG_ARGV[0], NEW.entity, NEW.occurrence);
    RETURN NEW;
END
$$;
CREATE TABLE public.effects (run text, entity text, occurrence text);
CREATE TRIGGER effects_forge BEFORE INSERT ON public.effects
    FOR EACH ROW EXECUTE FUNCTION public.forge_row('trigger');
CREATE CONSTRAINT TRIGGER effects_forge_deferred AFTER INSERT ON public.effects DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION public.forge_row('deferred');
GRANT ALL ON public.forge_keys, public.effects, public.forge_retry_budget TO PUBLIC;
GRANT ALL ON SEQUENCE public.forge_retry TO PUBLIC;
GRANT EXECUTE ON FUNCTION public.forge(text, text, text), public.forge_row() TO PUBLIC`

// forgeLeftovers are what an effect may leave on its session after it
// (#43): a session's advisory locks, a listener, a temporary table that the
// next effect's unqualified "effects" would find before public's, the
// driver's prepared statements deallocated, and domains and views in
// pg_temp named like the catalog's types and relations (planted once per
// session by plant_temp_traps, pgtest.TempTrapsSQL).
var forgeLeftovers = []string{
	`SELECT pg_catalog.pg_try_advisory_lock(pg_catalog.hashtext(entity)) FROM claimed`,
	`LISTEN forge_leftover`,
	`CREATE TEMP TABLE IF NOT EXISTS effects (run pg_catalog.text, entity pg_catalog.text, occurrence pg_catalog.text)`,
	`DEALLOCATE ALL`,
	`SELECT public.plant_temp_traps()`,
}

// forgeEffect is a chunk's effect for run: it raises at the effect point,
// writes effects (its triggers raise at the trigger and deferred points),
// and, if install, installs on "claimed" a trigger raising at the claimed
// point in the next chunks of this session (the insert path may refuse that;
// either way the invariant must hold). Then it leaves what leave says on
// the session (forgeLeftovers).
func forgeEffect(run string, install bool, leave []string) string {
	q := `SELECT public.forge('effect', entity, occurrence) FROM claimed;
INSERT INTO effects SELECT '` + run + `', entity, occurrence FROM claimed`
	for _, l := range leave {
		q += ";\n" + l
	}
	if install {
		q = `DO $i$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_trigger WHERE tgrelid = 'pg_temp.claimed'::regclass AND tgname = 'claimed_forge') THEN
        CREATE TRIGGER claimed_forge BEFORE INSERT ON pg_temp.claimed
            FOR EACH ROW EXECUTE FUNCTION public.forge_row('claimed');
    END IF;
END $i$;
` + q
	}
	return q
}

// forgeProcessor answers at random: ok, refused, refused for a retry, or a
// failed call whose error is a perfect forgery of the rule's violation (the
// engine's routine and file included), a bounded number of times.
type forgeProcessor struct {
	mu       sync.Mutex
	rng      *rand.Rand
	failures int
	ok       map[string]map[ledger.Key]bool // run -> keys it said ok for
}

func (p *forgeProcessor) Process(_ context.Context, run ledger.Run, claims []ledger.Claim) ([]ledger.Verdict, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failures > 0 && p.rng.IntN(4) == 0 {
		p.failures--
		return nil, fmt.Errorf("processor down: %w", &pgconn.PgError{Code: "23505", ConstraintName: ledger.BusinessKeyIndex,
			SchemaName: ledger.Schema, TableName: "ledger", Routine: "_bt_check_unique", File: "nbtinsert.c",
			Message: `duplicate key value violates unique constraint "ledger_business_key_uq"`})
	}
	out := make([]ledger.Verdict, len(claims))
	for i, c := range claims {
		switch p.rng.IntN(6) {
		case 0:
			out[i] = ledger.Verdict{Error: `ERROR: duplicate key value violates unique constraint "ledger_business_key_uq" (SQLSTATE 23505)`}
		case 1:
			if p.failures > 0 {
				p.failures--
				out[i] = ledger.Verdict{Retryable: true, Error: "23505 ledger_business_key_uq runledger.ledger"}
				break
			}
			fallthrough
		default:
			out[i] = ledger.Verdict{OK: true}
			if p.ok[run.UID] == nil {
				p.ok[run.UID] = map[ledger.Key]bool{}
			}
			p.ok[run.UID][c.Key] = true
		}
	}
	return out, nil
}

// forgeRun is one run of the test: its mode, its user code, its chunks.
type forgeRun struct {
	uid       string
	opts      func(chunk int) ledger.ChunkOptions
	chunks    [][]ledger.Item
	effect    bool
	processor bool
}

// forgeVerdict is one item's outcome as a run reported it.
type forgeVerdict struct {
	run     string
	key     ledger.Key
	outcome ledger.Outcome
	// sameChunk: a repeat of a key earlier in the chunk (checked there).
	sameChunk bool
	holder    string // the run whose committed row was read back
	at        time.Time
	err       error
}

// TestForging_Randomized (#20): user code raises every class of SQLSTATE,
// with the ledger's index, schema and table names in every field a RAISE can
// set, at every point user code runs (the effect, a trigger and a deferred
// constraint trigger of a table it writes, a trigger it installs on
// "claimed", a processor's answers and errors), over random batches (keys
// repeated within a chunk, overlapping between runs) of concurrent runs,
// Skip and Supersede, some run more than once. No item is ever already
// handled without a committed holder row of another run (or an earlier copy
// in its chunk), each run's completed keys are exactly its rows in the
// ledger, and each effect ran once per key of its run.
//
// The plan (keys, batches, what raises where) follows from the seed, printed
// first; set RUNLEDGER_FORGE_SEED to replay it (the interleaving of the
// concurrent runs is the scheduler's).
func TestForging_Randomized(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(forgeSeedEnv); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, forgeSeedEnv)
	}
	t.Logf("seed %d (replay: %s=%d go test ./internal/ledger -run TestForging_Randomized)", seed, forgeSeedEnv, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

	owner := newPool(t)
	ctx := context.Background()
	mustExec(t, owner, forgeSchema)
	mustExec(t, owner, `INSERT INTO public.forge_retry_budget VALUES (40)`)
	// What user code plants for runledger's statements to meet (#43): an
	// overload of every function and operator its SQL names, in public,
	// for every type it passes; domains and views in pg_temp, by effects.
	mustExec(t, owner, pgtest.TempTrapsSQL())
	require.Greater(t, pgtest.PlantPublicTraps(t, owner, pgtest.SQLCallNames(t, "../..")), int64(1000))
	// The store's sessions are runledger's own, as a worker opens them.
	pinned, perr := ledger.Open(ctx, owner.Config().ConnString(), 16)
	require.NoError(t, perr)
	t.Cleanup(pinned.Close)

	// The key space, and what raises where.
	const nKeys = 240
	keys := make([]ledger.Key, nKeys)
	for i := range keys {
		keys[i] = ledger.Key{Entity: fmt.Sprintf("acct-%03d", i%60), Occurrence: fmt.Sprintf("2026-%02d", 1+i/60)}
	}
	var poisoned int
	for _, k := range keys {
		for _, p := range forgePoints {
			if rng.IntN(10) == 0 {
				poisoned++
				code := forgeCodes[rng.IntN(len(forgeCodes))]
				if rng.IntN(2) == 0 {
					code = "23505" // the forgery that matters most, often
				}
				mustExec(t, owner, `INSERT INTO public.forge_keys VALUES ($1, $2, $3, $4)`, p, k.Entity, k.Occurrence, code)
			}
		}
	}
	// Every code is raised somewhere, at the effect.
	for i, c := range forgeCodes {
		k := keys[i%nKeys]
		mustExec(t, owner, `INSERT INTO public.forge_keys VALUES ('effect', $1, $2, $3) ON CONFLICT (point, entity, occurrence) DO UPDATE SET code = EXCLUDED.code`,
			k.Entity, k.Occurrence, c)
	}

	proc := &forgeProcessor{rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())), failures: 6, ok: map[string]map[ledger.Key]bool{}}
	var runs []*forgeRun
	for i := range 6 {
		r := &forgeRun{uid: fmt.Sprintf("run-%d", i)}
		mode := ledger.Skip
		if rng.IntN(2) == 0 {
			mode = ledger.Supersede
		}
		r.processor = i%3 == 2
		r.effect = !r.processor
		installs, expects, leaves := map[int]bool{}, map[int]bool{}, map[int][]string{}
		for c := range 2 + rng.IntN(5) {
			n := 1 + rng.IntN(30)
			chunk := make([]ledger.Item, n)
			for j := range chunk {
				chunk[j] = ledger.Item{Key: keys[rng.IntN(nKeys)], Payload: []byte(`{"n": 1}`)}
				if j > 0 && rng.IntN(8) == 0 {
					chunk[j] = chunk[rng.IntN(j)] // a repeat within the chunk
				}
			}
			r.chunks = append(r.chunks, chunk)
			installs[c] = rng.IntN(3) == 0
			expects[c] = rng.IntN(2) == 0
			for _, l := range forgeLeftovers {
				if rng.IntN(4) == 0 {
					leaves[c] = append(leaves[c], l)
				}
			}
		}
		uid := r.uid
		r.opts = func(c int) ledger.ChunkOptions {
			o := ledger.ChunkOptions{OnExisting: mode, EffectTimeout: 20 * time.Second, LockTimeout: 10 * time.Second, ExpectFresh: expects[c]}
			if r.processor {
				o.Processor = proc
			} else {
				o.Effect = forgeEffect(uid, installs[c], leaves[c])
			}
			return o
		}
		runs = append(runs, r)
		t.Logf("%s: %s, processor %v, %d chunks", r.uid, map[ledger.OnExisting]string{ledger.Skip: "Skip", ledger.Supersede: "Supersede"}[mode], r.processor, len(r.chunks))
	}
	t.Logf("%d poisoned (point, key) pairs", poisoned)

	s := ledger.NewStore(pinned)
	var mu sync.Mutex
	var verdicts []forgeVerdict
	var problems []string
	execute := func(r *forgeRun) {
		for c, chunk := range r.chunks {
			res := forgeCommit(t, s, r.uid, chunk, r.opts(c))
			at := time.Now()
			mu.Lock()
			for i, v := range res {
				if v.Err != nil && strings.Contains(v.Err.Error(), pgtest.Trapped) {
					problems = append(problems, fmt.Sprintf("%s: %s: a planted object was called: %v", r.uid, v.Key, v.Err))
				}
				verdicts = append(verdicts, forgeVerdict{run: r.uid, key: chunk[i].Key, outcome: v.Outcome, err: v.Err,
					sameChunk: v.Holder == ledger.HolderSameChunk, holder: v.HolderUID, at: at})
				if v.Outcome == ledger.AlreadyHandled && v.Holder == ledger.HolderSameChunk {
					first := firstCopy(chunk, i)
					if first == i || res[first].Outcome == ledger.Failed {
						problems = append(problems, fmt.Sprintf("%s: %s already handled as a repeat, but its first copy is %v", r.uid, v.Key, res[first].Outcome))
					}
				}
			}
			mu.Unlock()
		}
	}
	// Every run at once, then each again (a rerun racing the others).
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Go(func() { execute(r) })
	}
	wg.Wait()
	for _, r := range runs {
		if rng.IntN(2) == 0 {
			wg.Go(func() { execute(r) })
		}
	}
	wg.Wait()

	// The ledger, as it ended: the rows of each run (any state), the
	// committed holder of each key.
	rowsOf := map[string]map[ledger.Key]bool{}
	createdAt := map[string]map[ledger.Key]time.Time{}
	rows, err := owner.Query(ctx, `SELECT run_uid, entity, occurrence, created_at FROM runledger.ledger`)
	require.NoError(t, err)
	for rows.Next() {
		var run string
		var k ledger.Key
		var created time.Time
		require.NoError(t, rows.Scan(&run, &k.Entity, &k.Occurrence, &created))
		if rowsOf[run] == nil {
			rowsOf[run], createdAt[run] = map[ledger.Key]bool{}, map[ledger.Key]time.Time{}
		}
		rowsOf[run][k], createdAt[run][k] = true, created
	}
	require.NoError(t, rows.Err())
	// heldByAnother: a run other than run has a row for k (it may have been
	// superseded since, never deleted) begun before the verdict.
	heldByAnother := func(run string, k ledger.Key, at time.Time) bool {
		for other, ks := range rowsOf {
			if other != run && ks[k] && createdAt[other][k].Before(at) {
				return true
			}
		}
		return false
	}

	completed := map[string]map[ledger.Key]bool{}
	tallies := map[string]*tally{}
	for _, v := range verdicts {
		if tallies[v.run] == nil {
			tallies[v.run], completed[v.run] = &tally{}, map[ledger.Key]bool{}
		}
		switch v.outcome {
		case ledger.AlreadyHandled:
			tallies[v.run].already++
			if !v.sameChunk && !heldByAnother(v.run, v.key, v.at) {
				problems = append(problems, fmt.Sprintf("%s: %s is already handled, but no other run has a row for it", v.run, v.key))
			}
			if !v.sameChunk && (v.holder == v.run || !rowsOf[v.holder][v.key]) {
				problems = append(problems, fmt.Sprintf("%s: %s is already handled by %q, which has no row for it", v.run, v.key, v.holder))
			}
		case ledger.Completed:
			tallies[v.run].completed++
			completed[v.run][v.key] = true
		case ledger.Failed:
			tallies[v.run].failed++
		default:
			problems = append(problems, fmt.Sprintf("%s: %s has no outcome", v.run, v.key))
		}
	}
	for _, r := range runs {
		t.Logf("%s: %+v", r.uid, *tallies[r.uid])
		if !equalKeySets(completed[r.uid], rowsOf[r.uid]) {
			problems = append(problems, fmt.Sprintf("%s: its completed keys (%d) are not its rows in the ledger (%d)", r.uid, len(completed[r.uid]), len(rowsOf[r.uid])))
		}
		if r.effect {
			var effects, distinct int
			require.NoError(t, owner.QueryRow(ctx, `SELECT count(*), count(DISTINCT (entity, occurrence)) FROM public.effects WHERE run = $1`, r.uid).Scan(&effects, &distinct))
			if effects != len(rowsOf[r.uid]) || distinct != effects {
				problems = append(problems, fmt.Sprintf("%s: %d effect rows (%d keys) for %d ledger rows", r.uid, effects, distinct, len(rowsOf[r.uid])))
			}
		}
		if r.processor {
			for k := range rowsOf[r.uid] {
				if !proc.ok[r.uid][k] {
					problems = append(problems, fmt.Sprintf("%s: %s committed without the processor's ok", r.uid, k))
				}
			}
		}
	}
	// A key's history is what happened (#43.6): every run recorded as
	// retired from a key has a row of that key that was superseded (nothing
	// is pruned here); a processor's refusal under Supersede gives the
	// record back with the row.
	phantom := scalar[int64](t, owner, `SELECT count(*) FROM runledger.ledger_retired AS r
WHERE NOT EXISTS (SELECT FROM runledger.ledger AS l
                  WHERE l.run_uid = r.run_uid AND l.entity = r.entity AND l.occurrence = r.occurrence AND l.state = 'superseded')`)
	if phantom > 0 {
		problems = append(problems, fmt.Sprintf("%d retired-key records with no superseded row of their run", phantom))
	}
	dups := scalar[int64](t, owner, `SELECT count(*) FROM (SELECT 1 FROM runledger.ledger WHERE state = 'committed' GROUP BY entity, occurrence HAVING count(*) > 1) d`)
	if dups > 0 {
		problems = append(problems, fmt.Sprintf("%d keys have two committed rows", dups))
	}
	if len(problems) > 10 {
		problems = append(problems[:10], fmt.Sprintf("... and %d more", len(problems)-10))
	}
	require.Empty(t, problems, "seed %d (%s=%d)", seed, forgeSeedEnv, seed)
}

// forgeCommit commits a chunk, retrying what CommitChunk says to retry.
func forgeCommit(t *testing.T, s *ledger.Store, uid string, chunk []ledger.Item, opts ledger.ChunkOptions) []ledger.Result {
	t.Helper()
	for attempt := 0; ; attempt++ {
		res, err := s.CommitChunk(context.Background(), runNamed(uid), chunk, opts)
		if err == nil {
			require.Len(t, res, len(chunk))
			return res
		}
		if !ledger.IsRetryable(err) || attempt >= 80 {
			require.NoError(t, err, "%s: CommitChunk (attempt %d)", uid, attempt)
		}
		time.Sleep(time.Duration(1+attempt%5) * 5 * time.Millisecond)
	}
}

// firstCopy is the position of the first item of chunk with chunk[i]'s key.
func firstCopy(chunk []ledger.Item, i int) int {
	for j := range i {
		if chunk[j].Key == chunk[i].Key {
			return j
		}
	}
	return i
}

func equalKeySets(a, b map[ledger.Key]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}
