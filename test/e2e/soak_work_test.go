//go:build e2e

package e2e

// The soak's generator: a stream of runs (inline, query and processor
// batches; Skip and Supersede; keys overlapping between runs) and a
// ProcessingSchedule, all of whose effects write into the user's tables.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// soakSchema is the user's side, in the ledger's database: soak_sink is
// what the SQL effects do, with the user's own unique constraint (a run
// applies a key at most once); soak_effect_log gets a row for every applied
// effect call (a trigger, in the effect's transaction). The effect role may
// only INSERT: the log is append-only to it.
// (public: the login's "$user" schema is the ledger's, runledger.)
const soakSchema = `
SET search_path = public;
CREATE TABLE soak_sink (entity text NOT NULL, occurrence text NOT NULL, run text NOT NULL,
  CONSTRAINT soak_sink_once UNIQUE (entity, occurrence, run));
CREATE TABLE soak_effect_log (id bigserial PRIMARY KEY, entity text NOT NULL, occurrence text NOT NULL, run text NOT NULL,
  xid bigint NOT NULL DEFAULT txid_current(), at timestamptz NOT NULL DEFAULT clock_timestamp(),
  app text NOT NULL DEFAULT current_setting('application_name'));
CREATE FUNCTION soak_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO soak_effect_log (entity, occurrence, run) VALUES (NEW.entity, NEW.occurrence, NEW.run); RETURN NULL; END $$;
CREATE TRIGGER soak_log AFTER INSERT ON soak_sink FOR EACH ROW EXECUTE FUNCTION soak_log();
CREATE FUNCTION soak_slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.05); RETURN NULL; END $$;
CREATE TRIGGER soak_slow AFTER INSERT ON soak_sink FOR EACH STATEMENT EXECUTE FUNCTION soak_slow();
GRANT INSERT ON soak_sink, soak_effect_log TO runledger_effect;
GRANT USAGE ON SEQUENCE soak_effect_log_id_seq TO runledger_effect;`

// soakServiceSchema is the processor's side, in its own database (the
// ledger's, or with failovers one that no failover touches): it logs every
// request to soak_processor_log and does each key's work once in
// soak_processor_work; soak_fault is where the nemesis tells it to
// misbehave.
const soakServiceSchema = `
SET search_path = public;
CREATE TABLE soak_processor_log (id bigserial PRIMARY KEY, key text NOT NULL, entity text NOT NULL, occurrence text NOT NULL,
  run text NOT NULL, run_uid text NOT NULL, shard int NOT NULL, attempt int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE soak_processor_work (key text PRIMARY KEY, entity text NOT NULL, occurrence text NOT NULL, run text NOT NULL,
  at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE soak_fault (kind text PRIMARY KEY, until timestamptz NOT NULL, rate float8 NOT NULL, seconds float8 NOT NULL DEFAULT 0);`

// soakEffect is the SQL runs' effect: each claimed item into soak_sink,
// tagged with the run named in its payload (the generator's own record, not
// runledger's).
const soakEffect = `INSERT INTO soak_sink (entity, occurrence, run) SELECT entity, occurrence, payload->>'run' FROM claimed`

// The key spaces: SQL runs share soakOccurrence, processor runs
// soakProcessorOccurrence (work a processor did for a key whose commit was
// lost is not the SQL effect's to repeat: mixing them on one key would be
// two effects by design), each schedule tick its own occurrence.
const (
	soakOccurrence          = "2026-01"
	soakProcessorOccurrence = "2026-P"
	soakScheduleName        = "soak-sched"
	soakScheduleItems       = 150
	soakMaxActive           = 4
)

// soakRun is a run the soak created (or its schedule did), as the soak
// knows it: its batch's keys, in order, repeats included.
type soakRun struct {
	name, tag  string // tag: the payload's "run", which soak_sink records
	kind       string // inline, query, processor, schedule
	policy     v1alpha1.OnExistingPolicy
	occurrence string
	lo, hi     int
	repeats    int // the batch's first repeats keys again (query batches)
	createErr  error
	obj        *v1alpha1.ProcessingRun // at the end
}

type bizKey struct{ entity, occurrence string }

func (r *soakRun) keys() []bizKey {
	var out []bizKey
	for i := r.lo; i <= r.hi; i++ {
		out = append(out, bizKey{fmt.Sprintf("acct-%d", i), r.occurrence})
	}
	for i := r.lo; i < r.lo+r.repeats; i++ {
		out = append(out, bizKey{fmt.Sprintf("acct-%d", i), r.occurrence})
	}
	return out
}

func (r *soakRun) processor() bool { return r.kind == "processor" }

// nextRun is the i-th run of the seed's stream. Its keys start a little
// before the stream's front (which moves on with i): each run overlaps the
// last few and brings new keys, so effects keep running all along.
func nextRun(rng *rand.Rand, i int) *soakRun {
	r := &soakRun{policy: v1alpha1.OnExistingSkip, occurrence: soakOccurrence}
	switch p := rng.IntN(10); {
	case p < 3:
		r.kind = "inline"
		r.lo = max(1, 1+i*2500-rng.IntN(5000))
		r.hi = r.lo + 200 + rng.IntN(1800)
	case p < 7:
		r.kind = "query"
		r.lo = max(1, 1+i*2500-rng.IntN(5000))
		r.hi = r.lo + 2000 + rng.IntN(8000)
		if rng.IntN(3) == 0 {
			r.repeats = 10
		}
	default:
		r.kind = "processor"
		r.occurrence = soakProcessorOccurrence
		r.lo = max(1, 1+i*150-rng.IntN(300))
		r.hi = r.lo + 100 + rng.IntN(400)
	}
	if rng.IntN(5) == 0 {
		r.policy = v1alpha1.OnExistingSupersede
	}
	r.name = fmt.Sprintf("r%03d-%s", i, r.kind)
	r.tag = r.name
	return r
}

// spec is the run object of r; workers and chunk come from rng.
func (s *soak) spec(r *soakRun, rng *rand.Rand) *v1alpha1.ProcessingRun {
	var batch v1alpha1.BatchSpec
	if r.kind == "query" {
		q := fmt.Sprintf(`SELECT 'acct-' || i AS entity, %s AS occurrence, jsonb_build_object('run', %s, 'amount', i) AS payload FROM generate_series(%d, %d) i`,
			sqlString(r.occurrence), sqlString(r.tag), r.lo, r.hi)
		if r.repeats > 0 {
			q += fmt.Sprintf(` UNION ALL SELECT 'acct-' || i, %s, jsonb_build_object('run', %s, 'amount', i) FROM generate_series(%d, %d) i`,
				sqlString(r.occurrence), sqlString(r.tag), r.lo, r.lo+r.repeats-1)
		}
		batch.Query = q
	} else {
		for _, k := range r.keys() {
			batch.Items = append(batch.Items, v1alpha1.Item{Entity: k.entity, Occurrence: k.occurrence,
				Payload: &apiextensionsv1.JSON{Raw: fmt.Appendf(nil, `{"run":%q}`, r.tag)}})
		}
	}
	run := s.f.newRun(r.name, runSpec{workers: int32(1 + rng.IntN(3)), chunk: int32(50 + rng.IntN(251)), batch: batch})
	s.soakSpec(&run.Spec, r.processor())
	run.Spec.OnExisting = r.policy
	return run
}

// soakSpec sets what every soak run shares: its effect, retries enough to
// outlast the nemesis, lost nodes replaced at once, a lock timeout the lock
// stalls sometimes exceed.
func (s *soak) soakSpec(spec *v1alpha1.ProcessingRunSpec, processor bool) {
	spec.Effect = &v1alpha1.EffectSpec{SQL: soakEffect}
	if processor {
		spec.Effect = &v1alpha1.EffectSpec{Processor: &v1alpha1.ProcessorSpec{
			Image: s.image, MaxItemsPerCall: 20, Timeout: &metav1.Duration{Duration: 5 * time.Second},
			Env: []corev1.EnvVar{{Name: "SOAK_DSN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: s.svcSecret}, Key: secretKey}}}},
		}}
	}
	spec.BackoffLimit = ptr.To[int32](10)
	spec.NodeLostAfterSeconds = ptr.To[int32](0)
	spec.Timeouts = &v1alpha1.Timeouts{LockSeconds: 10}
}

func sqlString(s string) string { return "'" + s + "'" } // the soak's own names: no quote in them

// generate creates the seed's stream of runs, one every 1-4 s while fewer
// than soakMaxActive are unfinished, until ctx ends. It runs in its own
// goroutine: it records errors, never fails the test itself.
func (s *soak) generate(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.cfg.Seed, 1))
	for i := 0; ; {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(1000+rng.IntN(3000)) * time.Millisecond):
		}
		if n, err := s.unfinished(ctx); err != nil || n >= soakMaxActive {
			continue
		}
		r := nextRun(rng, i)
		run := s.spec(r, rng)
		i++
		r.createErr = s.f.c.Create(context.Background(), run)
		s.mu.Lock()
		s.runs = append(s.runs, r)
		s.mu.Unlock()
	}
}

// unfinished is the number of the namespace's runs not Succeeded or Failed.
func (s *soak) unfinished(ctx context.Context) (int, error) {
	var runs v1alpha1.ProcessingRunList
	if err := s.f.c.List(ctx, &runs, client.InNamespace(s.f.ns)); err != nil {
		return 0, err
	}
	n := 0
	for i := range runs.Items {
		if !finished(&runs.Items[i]) {
			n++
		}
	}
	return n, nil
}

func finished(r *v1alpha1.ProcessingRun) bool {
	return isTrue(r, v1alpha1.ConditionComplete) || isTrue(r, v1alpha1.ConditionFailed)
}

// createSchedule starts a schedule of every minute, each tick's run a
// query over soakScheduleItems accounts of its own occurrence.
func (s *soak) createSchedule() {
	f := s.f
	q := fmt.Sprintf(`SELECT 'acct-' || i AS entity, current_setting('%[1]s') AS occurrence, `+
		`jsonb_build_object('run', 'sched:' || current_setting('%[1]s'), 'amount', i) AS payload FROM generate_series(1, %[2]d) i`,
		v1alpha1.OccurrenceSetting, soakScheduleItems)
	tmpl := f.newRun(soakScheduleName, runSpec{workers: 1, chunk: 50, batch: v1alpha1.BatchSpec{Query: q}}).Spec
	s.soakSpec(&tmpl, false)
	sched := &v1alpha1.ProcessingSchedule{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: soakScheduleName},
		Spec: v1alpha1.ProcessingScheduleSpec{
			Schedule:                   "* * * * *",
			SuccessfulRunsHistoryLimit: ptr.To[int32](100),
			FailedRunsHistoryLimit:     ptr.To[int32](100),
			RunTemplate:                v1alpha1.RunTemplate{Spec: tmpl},
		},
	}
	if err := f.c.Create(f.ctx, sched); err != nil {
		f.t.Fatalf("create schedule: %v", err)
	}
}

// suspendSchedule stops the ticks: the drain waits for the runs there are.
func (s *soak) suspendSchedule() {
	f := s.f
	for i := 0; ; i++ {
		var sched v1alpha1.ProcessingSchedule
		err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: soakScheduleName}, &sched)
		if err == nil {
			sched.Spec.Suspend = true
			err = f.c.Update(f.ctx, &sched)
		}
		if err == nil {
			return
		}
		if i == 20 {
			f.t.Fatalf("suspend the schedule: %v", err)
		}
		time.Sleep(time.Second)
	}
}

// drain waits until every run of the namespace is Succeeded or Failed, and
// returns those that are not after timeout, each with its status.
func (s *soak) drain(timeout time.Duration) []string {
	f := s.f
	deadline := time.Now().Add(timeout)
	for {
		var runs v1alpha1.ProcessingRunList
		err := f.c.List(f.ctx, &runs, client.InNamespace(f.ns))
		var open []string
		if err == nil {
			for i := range runs.Items {
				if r := &runs.Items[i]; !finished(r) {
					open = append(open, fmt.Sprintf("run %s did not finish within %s of the last fault: %s", r.Name, timeout, statusLine(r)))
				}
			}
		}
		if err == nil && len(open) == 0 {
			f.t.Logf("every run is finished (%.0fs after the nemesis stopped)", timeout.Seconds()-time.Until(deadline).Seconds())
			return nil
		}
		if time.Now().After(deadline) {
			sort.Strings(open)
			return open
		}
		time.Sleep(2 * time.Second)
	}
}
