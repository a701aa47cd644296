//go:build e2e

package e2e

// The soak's checker. It does not take runledger's word: what was applied
// is read from the user's tables (soak_sink and soak_effect_log for SQL
// effects, soak_processor_log and soak_processor_work for the processor),
// and which items each run had from the generator's own record; each run's
// status counts and the ledger are then held to them.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/worker"
)

// soakData is what the database holds at the end.
type soakData struct {
	sink          map[bizKey][]string       // the run tags that applied each key (soak_sink)
	sinkRows      int                       //
	effectCalls   map[bizKey]map[string]int // soak_effect_log: calls by key and run tag
	effectRows    int
	work          map[bizKey][]string        // idempotency keys the processor did work for
	requested     map[string]map[bizKey]bool // processor requests: run name -> keys
	keyBiz        map[string]map[bizKey]bool // idempotency key -> business keys it came with
	requests      int                        // processor requests (items sent), all
	ledger        map[string]map[bizKey]int  // run uid -> its rows (any state) by key
	committed     map[bizKey]int             // committed ledger rows by key
	failureErrors map[string][]string        // run uid -> failure records' errors
	// runIdems: the idempotency keys each run sent for each business key
	// (run name -> key -> idempotency keys).
	runIdems map[string]map[bizKey]map[string]bool
	// proofs: what the ledger proves of each finished run (run uid ->),
	// as runledger verify reads it (ledger.Store.ProveRun).
	proofs map[string]runProof
}

// runProof is what the ledger proves of a run's counts: Proven when it
// proves a verdict for every item; Unproven names the first items it does
// not (or why the proof could not be read).
type runProof struct {
	v1alpha1.ItemCounts
	Proven   bool
	Unproven []string
}

func (s *soak) load(runs []*soakRun) *soakData {
	f, svc := s.f, s.svc
	d := &soakData{}
	key := func(r pgx.Rows, extra ...any) (bizKey, error) {
		var k bizKey
		err := r.Scan(append([]any{&k.entity, &k.occurrence}, extra...)...)
		return k, err
	}
	f.rows(func() { d.sink, d.sinkRows = map[bizKey][]string{}, 0 }, func(r pgx.Rows) error {
		var tag string
		k, err := key(r, &tag)
		d.sink[k] = append(d.sink[k], tag)
		d.sinkRows++
		return err
	}, `SELECT entity, occurrence, run FROM soak_sink`)
	f.rows(func() { d.effectCalls, d.effectRows = map[bizKey]map[string]int{}, 0 }, func(r pgx.Rows) error {
		var tag string
		k, err := key(r, &tag)
		if d.effectCalls[k] == nil {
			d.effectCalls[k] = map[string]int{}
		}
		d.effectCalls[k][tag]++
		d.effectRows++
		return err
	}, `SELECT entity, occurrence, run FROM soak_effect_log`)
	svc.rows(func() { d.work = map[bizKey][]string{} }, func(r pgx.Rows) error {
		var idem string
		k, err := key(r, &idem)
		d.work[k] = append(d.work[k], idem)
		return err
	}, `SELECT entity, occurrence, key FROM soak_processor_work`)
	svc.rows(func() {
		d.requested, d.keyBiz, d.requests = map[string]map[bizKey]bool{}, map[string]map[bizKey]bool{}, 0
		d.runIdems = map[string]map[bizKey]map[string]bool{}
	}, func(r pgx.Rows) error {
		var run, idem string
		k, err := key(r, &run, &idem)
		if d.requested[run] == nil {
			d.requested[run] = map[bizKey]bool{}
			d.runIdems[run] = map[bizKey]map[string]bool{}
		}
		d.requested[run][k] = true
		if d.runIdems[run][k] == nil {
			d.runIdems[run][k] = map[string]bool{}
		}
		d.runIdems[run][k][idem] = true
		if d.keyBiz[idem] == nil {
			d.keyBiz[idem] = map[bizKey]bool{}
		}
		d.keyBiz[idem][k] = true
		d.requests++
		return err
	}, `SELECT entity, occurrence, run, key FROM soak_processor_log`)
	f.rows(func() { d.ledger, d.committed = map[string]map[bizKey]int{}, map[bizKey]int{} }, func(r pgx.Rows) error {
		var uid, state string
		k, err := key(r, &uid, &state)
		if d.ledger[uid] == nil {
			d.ledger[uid] = map[bizKey]int{}
		}
		d.ledger[uid][k]++
		if state == "committed" {
			d.committed[k]++
		}
		return err
	}, `SELECT entity, occurrence, run_uid, state FROM runledger.ledger`)
	f.rows(func() { d.failureErrors = map[string][]string{} }, func(r pgx.Rows) error {
		var uid, msg string
		err := r.Scan(&uid, &msg)
		d.failureErrors[uid] = append(d.failureErrors[uid], msg)
		return err
	}, `SELECT run_uid, error FROM runledger.item_failure`)
	d.proofs = s.proofs(runs)
	return d
}

// proofs is what the ledger (of the server the soak's DSN reaches: after
// failovers, the survivor) proves of each finished run, as runledger
// verify does: its batch's items and their holders, the counts recomputed.
func (s *soak) proofs(runs []*soakRun) map[string]runProof {
	out := map[string]runProof{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, s.f.dsn)
	if err != nil {
		s.f.t.Fatalf("connect to the ledger: %v", err)
	}
	defer pool.Close()
	store := ledger.NewStore(pool)
	for _, r := range runs {
		if !finished(r.obj) {
			continue
		}
		out[string(r.obj.UID)] = proveSoakRun(ctx, store, r)
	}
	return out
}

func proveSoakRun(ctx context.Context, store *ledger.Store, r *soakRun) runProof {
	var p runProof
	records, err := store.FindRuns(ctx, r.obj.Namespace, r.obj.Name)
	if err != nil {
		p.Unproven = append(p.Unproven, err.Error())
		return p
	}
	i := slices.IndexFunc(records, func(rec ledger.RunRecord) bool { return rec.UID == string(r.obj.UID) })
	if i < 0 {
		p.Unproven = append(p.Unproven, "the ledger has no record of the run")
		return p
	}
	var batch []ledger.Key
	if records[i].Source == ledger.BatchSourceStatic {
		for _, k := range r.keys() {
			batch = append(batch, ledger.Key{Entity: k.entity, Occurrence: k.occurrence})
		}
	}
	proof, err := store.ProveRun(ctx, records[i], batch, func(k ledger.KeyProof, v ledger.KeyVerdict) error {
		if v.Problem != "" && len(p.Unproven) < 5 {
			p.Unproven = append(p.Unproven, fmt.Sprintf("%s/%s %s (%s)", k.Entity, k.Occurrence, v.Verdict, v.Problem))
		}
		return nil
	})
	if err != nil {
		p.Unproven = append(p.Unproven, err.Error())
		return p
	}
	p.ItemCounts = proof.ItemCounts
	p.Proven = proof.Proven()
	if !p.Proven && len(p.Unproven) == 0 {
		p.Unproven = append(p.Unproven, fmt.Sprintf("%+v", proof))
	}
	return p
}

// soakReport is the checker's verdict and the summary's figures.
type soakReport struct {
	runs, succeeded, failed, scheduleRuns int
	items                                 int64
	elapsed                               time.Duration
	failedVisibly                         int64 // items of Failed runs not applied: failed, and the run says why
	replacements, failedAttempts          int
	requests, redeliveries                int
	processorRestarts                     int // the processor containers' restarts (its crashes)
	supersedeRekeyed                      int // keys a Supersede run sent under two keys (a concurrent commit between its tries)
	serverChangesLogged                   int // worker logs: the ledger's server changed under a shard
	serverChangedEvents                   int // Events LedgerServerChanged: a shard succeeded across such a change
	proofsNotOnStandby                    int // worker logs: a shard's proof reported before a standby was known to have it
	chunkRetries                          int // retries the workers logged

	lost, double, mismatch, notTerminal, leaks, harness []string
}

func (r *soakReport) problems() []string {
	var out []string
	for _, l := range []struct {
		what string
		list []string
	}{{"lost", r.lost}, {"double", r.double}, {"count mismatch", r.mismatch}, {"not terminal", r.notTerminal}, {"leak", r.leaks}, {"harness", r.harness}} {
		for i, p := range l.list {
			if i == 20 {
				out = append(out, fmt.Sprintf("%s: ... and %d more", l.what, len(l.list)-20))
				break
			}
			out = append(out, l.what+": "+p)
		}
	}
	return out
}

// check reads the end state and holds every run to it.
func (s *soak) check(t *testing.T) *soakReport {
	t.Helper()
	f := s.f
	rep := &soakReport{}
	var list v1alpha1.ProcessingRunList
	if err := f.c.List(f.ctx, &list, client.InNamespace(f.ns)); err != nil {
		f.t.Fatalf("list runs: %v", err)
	}
	byName := map[string]*v1alpha1.ProcessingRun{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	runs := s.checkedRuns(byName, rep)
	s.verdict(runs, s.load(runs), rep)
	var pods corev1.PodList
	if err := f.c.List(f.ctx, &pods, client.InNamespace(f.ns), client.HasLabels{v1alpha1.LabelRunUID}); err == nil {
		for _, p := range pods.Items {
			l := s.podLogged(p.Name)
			rep.chunkRetries += l.retries
			rep.serverChangesLogged += l.serverChanges
			rep.proofsNotOnStandby += l.notOnStandby
			for _, c := range p.Status.InitContainerStatuses {
				if c.Name == v1alpha1.ProcessorContainerName {
					rep.processorRestarts += int(c.RestartCount)
				}
			}
		}
	}
	var events corev1.EventList
	if err := f.c.List(f.ctx, &events, client.InNamespace(f.ns)); err == nil {
		for _, e := range events.Items {
			if e.Reason == "LedgerServerChanged" {
				rep.serverChangedEvents++
				t.Logf("Event %s on %s: %s", e.Reason, e.InvolvedObject.Name, e.Message)
			}
		}
	}
	return rep
}

// podLog is what a worker pod's log shows (nothing when the log is gone
// with its node): retries (a retryable error, the database unreachable),
// the times it noticed that the ledger's server changed (a failover, a
// restart), and the shard proofs no standby was known to have when
// reported (a failover then can lose them).
type podLog struct{ retries, serverChanges, notOnStandby int }

func (s *soak) podLogged(pod string) podLog {
	ctx, cancel := context.WithTimeout(s.f.ctx, 20*time.Second)
	defer cancel()
	b, err := s.f.cs.CoreV1().Pods(s.f.ns).GetLogs(pod, &corev1.PodLogOptions{Container: v1alpha1.WorkerContainerName}).DoRaw(ctx)
	if err != nil {
		return podLog{}
	}
	l := string(b)
	return podLog{
		retries:       strings.Count(l, `"msg":"retrying after a retryable error"`) + strings.Count(l, `"msg":"database not reachable, retrying"`),
		serverChanges: strings.Count(l, `"msg":"the ledger's database is another server now`),
		notOnStandby: strings.Count(l, `"msg":"no standby of the ledger's server has the shard's proof yet`) +
			strings.Count(l, `"msg":"whether a standby of the ledger's server has the shard's proof is unknown`),
	}
}

// verdict holds the runs to the data, into rep.
func (s *soak) verdict(runs []*soakRun, d *soakData, rep *soakReport) {
	supersedes := map[bizKey]int{} // Supersede runs whose batch holds the key
	skipTags := map[string]bool{}
	uids := map[string]bool{}
	for _, r := range runs {
		uids[string(r.obj.UID)] = true
		if r.policy == v1alpha1.OnExistingSupersede {
			for k := range distinct(r.keys()) {
				supersedes[k]++
			}
		} else {
			skipTags[r.tag] = true
		}
	}
	for _, r := range runs {
		s.checkRun(r, d, rep)
	}
	s.checkOverall(runs, d, rep, supersedes, skipTags, uids)
	rep.requests = d.requests
	rep.redeliveries = d.requests - len(d.keyBiz)
}

// checkedRuns are the generated runs and the schedule's, with their objects.
func (s *soak) checkedRuns(byName map[string]*v1alpha1.ProcessingRun, rep *soakReport) []*soakRun {
	s.mu.Lock()
	gen := slices.Clone(s.runs)
	s.mu.Unlock()
	var runs []*soakRun
	known := map[string]bool{}
	for _, r := range gen {
		known[r.name] = true
		if r.createErr != nil {
			rep.harness = append(rep.harness, fmt.Sprintf("run %s was not created: %v", r.name, r.createErr))
			continue
		}
		if r.obj = byName[r.name]; r.obj == nil {
			rep.mismatch = append(rep.mismatch, fmt.Sprintf("run %s was created and is gone", r.name))
			continue
		}
		runs = append(runs, r)
	}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		obj := byName[name]
		if known[name] {
			continue
		}
		if obj.Labels[v1alpha1.LabelSchedule] != soakScheduleName {
			rep.mismatch = append(rep.mismatch, fmt.Sprintf("run %s: neither the soak nor its schedule created it", name))
			continue
		}
		occ := obj.Spec.Occurrence
		runs = append(runs, &soakRun{name: name, tag: "sched:" + occ, kind: "schedule", policy: v1alpha1.OnExistingSkip,
			occurrence: occ, lo: 1, hi: soakScheduleItems, obj: obj})
		rep.scheduleRuns++
	}
	return runs
}

func distinct(keys []bizKey) map[bizKey]bool {
	out := map[bizKey]bool{}
	for _, k := range keys {
		out[k] = true
	}
	return out
}

// checkRun: the run is terminal; its counts equal what it applied (the
// user's tables) and its ledger rows; each item of a Succeeded run is
// applied by it or, under Skip, by another run; a Failed run says why.
func (s *soak) checkRun(r *soakRun, d *soakData, rep *soakReport) {
	obj := r.obj
	st := obj.Status
	keys := r.keys()
	batch := distinct(keys)
	uid := string(obj.UID)
	rep.runs++
	rep.items += st.Total
	if st.CompletionTime != nil {
		rep.elapsed = max(rep.elapsed, st.CompletionTime.Sub(s.start))
	}
	for _, sh := range st.Shards {
		rep.failedAttempts += int(sh.FailedAttempts)
		if n := len(s.f.mon.podsOfShard(obj, int(sh.Index))); n > 1 {
			rep.replacements += n - 1
		}
	}
	mismatch := func(format string, args ...any) {
		rep.mismatch = append(rep.mismatch, fmt.Sprintf("run %s (%s, %s): ", r.name, r.kind, r.policy)+fmt.Sprintf(format, args...))
	}
	if st.Total != int64(len(keys)) {
		mismatch("total %d, its batch has %d items", st.Total, len(keys))
	}
	rows := d.ledger[uid]
	if st.Completed != int64(len(rows)) {
		mismatch("completed %d, the ledger holds %d rows of it", st.Completed, len(rows))
	}
	// applied: the keys this run's effect did, by the user's tables.
	applied := map[bizKey]bool{}
	if r.processor() {
		for k := range rows {
			if !d.requested[r.name][k] {
				mismatch("the ledger holds %s/%s for it, the processor was never sent it by this run", k.entity, k.occurrence)
			}
			if len(d.work[k]) == 0 {
				mismatch("the ledger holds %s/%s for it, the processor did no work for it", k.entity, k.occurrence)
			}
			applied[k] = true
		}
	} else {
		for k := range batch {
			if slices.Contains(d.sink[k], r.tag) {
				applied[k] = true
			}
		}
		if st.Completed != int64(len(applied)) {
			mismatch("completed %d, its effect applied %d keys (soak_sink)", st.Completed, len(applied))
		}
		for k := range rows {
			if !applied[k] {
				mismatch("the ledger holds %s/%s for it, its effect never applied it", k.entity, k.occurrence)
			}
		}
		for k := range applied {
			if rows[k] == 0 {
				mismatch("its effect applied %s/%s, the ledger has no row of it", k.entity, k.occurrence)
			}
		}
	}
	if r.processor() {
		for _, k := range sortedKeys(d.runIdems[r.name]) {
			idems := d.runIdems[r.name][k]
			first := worker.IdempotencyKey(ledger.Key{Entity: k.entity, Occurrence: k.occurrence}, 0)
			switch {
			case r.policy == v1alpha1.OnExistingSkip && (len(idems) > 1 || !idems[first]):
				rep.double = append(rep.double, fmt.Sprintf("run %s (Skip) sent %s/%s under %d idempotency keys, not only its first generation's: %v",
					r.name, k.entity, k.occurrence, len(idems), slices.Sorted(maps.Keys(idems))))
			case len(idems) > 1:
				// A Supersede run's key names the generation its claim
				// commits: another only when a concurrent Supersede run
				// committed the key between its tries.
				rep.supersedeRekeyed++
			}
		}
	}
	// A Succeeded run's counts are what the ledger (the survivor's, after
	// failovers) proves, item by item, as runledger verify judges them.
	// (payloadChanged aside: ProveRun does not count it. A Failed run's
	// unprocessed items are missing by design; its completed is held to
	// its ledger rows above.)
	if isTrue(obj, v1alpha1.ConditionComplete) {
		got := st.ItemCounts
		got.PayloadChanged = 0
		switch p, ok := d.proofs[uid]; {
		case !ok:
			mismatch("the ledger was not asked to prove it")
		case !p.Proven:
			mismatch("the ledger does not prove its items: %s", strings.Join(p.Unproven, "; "))
		case p.ItemCounts != got:
			mismatch("its counts %s, the ledger proves %s", countsLine(got), countsLine(p.ItemCounts))
		}
	}
	var sum int64
	for _, sh := range st.Shards {
		sum += sh.Total
	}
	if finished(obj) && sum != st.Total {
		mismatch("its shards' totals add up to %d, the run says %d", sum, st.Total)
	}
	switch {
	case isTrue(obj, v1alpha1.ConditionComplete):
		rep.succeeded++
		if got := st.Completed + st.AlreadyHandled + st.Failed; got != st.Total {
			mismatch("completed+alreadyHandled+failed = %d, total %d", got, st.Total)
		}
		if n := unaccounted(r, batch, applied, d); n > 0 {
			rep.lost = append(rep.lost, fmt.Sprintf("run %s (%s, %s) Succeeded with %d items neither applied by it nor, under Skip, by another run (failed %d)",
				r.name, r.kind, r.policy, n, st.Failed))
		}
	case isTrue(obj, v1alpha1.ConditionFailed):
		rep.failed++
		c := findCondition(obj, v1alpha1.ConditionFailed)
		n := unaccounted(r, batch, applied, d)
		if c.Reason == "" || c.Message == "" {
			rep.lost = append(rep.lost, fmt.Sprintf("run %s Failed without saying why; %d items not applied", r.name, n))
		} else {
			rep.failedVisibly += int64(n)
		}
	}
}

func countsLine(c v1alpha1.ItemCounts) string {
	return fmt.Sprintf("total=%d completed=%d alreadyHandled=%d failed=%d", c.Total, c.Completed, c.AlreadyHandled, c.Failed)
}

// unaccounted is the number of the batch's keys neither applied by the run
// nor, under Skip, applied by another (an SQL run's sink row, or the
// processor's work for the processor's keys).
func unaccounted(r *soakRun, batch, applied map[bizKey]bool, d *soakData) int {
	n := 0
	for k := range batch {
		if applied[k] {
			continue
		}
		if r.policy == v1alpha1.OnExistingSkip && (len(d.work[k]) > 0 || slices.ContainsFunc(d.sink[k], func(tag string) bool { return tag != r.tag })) {
			continue
		}
		n++
	}
	return n
}

// checkOverall: nothing applied twice, no application or ledger row of a
// run that does not exist, the effect log and the sink agree.
func (s *soak) checkOverall(runs []*soakRun, d *soakData, rep *soakReport, supersedes map[bizKey]int, skipTags, uids map[string]bool) {
	tags := map[string]bool{}
	for _, r := range runs {
		tags[r.tag] = true
		for _, c := range r.obj.Status.Conditions {
			if strings.Contains(c.Message, "soak_sink_once") {
				rep.double = append(rep.double, fmt.Sprintf("run %s: the user's unique constraint refused a second application: %s", r.name, c.Message))
			}
		}
		for _, msg := range d.failureErrors[string(r.obj.UID)] {
			if strings.Contains(msg, "soak_sink_once") {
				rep.double = append(rep.double, fmt.Sprintf("run %s: an item failed on the user's unique constraint: %s", r.name, msg))
				break
			}
		}
	}
	if d.sinkRows != d.effectRows {
		rep.mismatch = append(rep.mismatch, fmt.Sprintf("soak_sink has %d rows, soak_effect_log %d", d.sinkRows, d.effectRows))
	}
	for _, k := range sortedKeys(d.effectCalls) {
		for tag, n := range d.effectCalls[k] {
			if n > 1 {
				rep.double = append(rep.double, fmt.Sprintf("%s/%s: the effect of %s was applied %d times", k.entity, k.occurrence, tag, n))
			}
		}
	}
	for _, k := range sortedKeys(d.sink) {
		skips := 0
		for _, tag := range d.sink[k] {
			if !tags[tag] {
				rep.mismatch = append(rep.mismatch, fmt.Sprintf("%s/%s applied for %q, no run of the soak", k.entity, k.occurrence, tag))
			}
			if skipTags[tag] {
				skips++
			}
		}
		if skips > 1 {
			rep.double = append(rep.double, fmt.Sprintf("%s/%s applied by %d Skip runs: %v", k.entity, k.occurrence, skips, d.sink[k]))
		}
	}
	for _, k := range sortedKeys(d.work) {
		if n := len(d.work[k]); n > 1+supersedes[k] {
			rep.double = append(rep.double, fmt.Sprintf("%s/%s: the processor did its work under %d keys, %d Supersede runs hold it", k.entity, k.occurrence, n, supersedes[k]))
		}
	}
	for idem, ks := range d.keyBiz {
		if len(ks) > 1 {
			rep.double = append(rep.double, fmt.Sprintf("idempotency key %s was sent for %d business keys", idem, len(ks)))
		}
	}
	for _, k := range sortedKeys(d.committed) {
		if d.committed[k] > 1 {
			rep.double = append(rep.double, fmt.Sprintf("%s/%s has %d committed ledger rows", k.entity, k.occurrence, d.committed[k]))
		}
	}
	for uid := range d.ledger {
		if !uids[uid] {
			rep.mismatch = append(rep.mismatch, fmt.Sprintf("the ledger holds %d rows of run uid %s, no run of the soak", len(d.ledger[uid]), uid))
		}
	}
}

func sortedKeys[V any](m map[bizKey]V) []bizKey {
	ks := slices.Collect(maps.Keys(m))
	sort.Slice(ks, func(i, j int) bool {
		if ks[i].occurrence != ks[j].occurrence {
			return ks[i].occurrence < ks[j].occurrence
		}
		return ks[i].entity < ks[j].entity
	})
	return ks
}

// databases are the soak's databases: the ledger's, and the processor's
// when it has its own.
func (s *soak) databases() []*fixture {
	if s.svc == nil || s.svc.dsn == s.f.dsn {
		return []*fixture{s.f}
	}
	return []*fixture{s.f, s.svc}
}

// leaks waits until no worker pod is live, and no session nor lock of the
// soak's database remains (but the checker's own), for up to timeout.
func (s *soak) leaks(timeout time.Duration) []string {
	f := s.f
	deadline := time.Now().Add(timeout)
	for {
		var out []string
		var pods corev1.PodList
		if err := f.c.List(f.ctx, &pods, client.InNamespace(f.ns), client.HasLabels{v1alpha1.LabelRunUID}); err != nil {
			out = append(out, fmt.Sprintf("list pods: %v", err))
		}
		for _, p := range pods.Items {
			if live(&p) {
				out = append(out, fmt.Sprintf("worker pod %s still %s on %s (deleting: %v)", p.Name, p.Status.Phase, p.Spec.NodeName, p.DeletionTimestamp != nil))
			}
		}
		for _, db := range s.databases() {
			db.rows(func() {}, func(r pgx.Rows) error {
				var pid int32
				var app, state, client, since, last string
				err := r.Scan(&pid, &app, &state, &client, &since, &last)
				// Where from and since when: a worker killed behind a dropped link
				// leaves a session its server keeps only while something answers
				// its keep-alives.
				out = append(out, fmt.Sprintf("session %d (%s) still open in %s, %s; from %s, connected %s, last state change %s",
					pid, app, db.db, state, client, since, last))
				return err
			}, `SELECT pid, application_name, coalesce(state, ''), coalesce(host(client_addr) || ':' || client_port, 'a local socket'),
       coalesce(to_char(backend_start AT TIME ZONE 'UTC', 'HH24:MI:SS'), '?'), coalesce(to_char(state_change AT TIME ZONE 'UTC', 'HH24:MI:SS'), '?')
FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
			if n := db.int(`SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database WHERE d.datname = current_database() AND l.pid <> pg_backend_pid()`); n > 0 {
				out = append(out, fmt.Sprintf("%d locks still held in %s", n, db.db))
			}
			if n := db.int(`SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()`); n > 0 {
				out = append(out, fmt.Sprintf("%d prepared transactions left in %s", n, db.db))
			}
		}
		if len(out) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return out
		}
		time.Sleep(3 * time.Second)
	}
}

// summary is the block a user can quote.
func (r *soakReport) summary(s *soak) string {
	var b strings.Builder
	perSec := 0.0
	if r.elapsed > 0 {
		perSec = float64(r.items) / r.elapsed.Seconds()
	}
	total := 0
	var faults []string
	for _, k := range slices.Sorted(maps.Keys(s.cfg.faultWeights())) {
		faults = append(faults, fmt.Sprintf("%s=%d", k, s.faults[k]))
		total += s.faults[k]
	}
	verdict := "PASS"
	if len(r.problems()) > 0 {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "runledger soak %s: seed=%d duration=%s  %s\n", s.cfg.Name, s.cfg.Seed, s.cfg.Duration, verdict)
	ledgerOn := "the cluster's PostgreSQL"
	if s.cfg.Failovers {
		ledgerOn = "an HA formation (pg_auto_failover: a primary and its standby)"
	}
	fmt.Fprintf(&b, "  ledger on %s; the counts of every succeeded run proven by its ledger item by item\n", ledgerOn)
	fmt.Fprintf(&b, "  runs=%d (succeeded=%d failed=%d, of them schedule=%d) items=%d in %s items/s=%.1f\n",
		r.runs, r.succeeded, r.failed, r.scheduleRuns, r.items, r.elapsed.Round(time.Second), perSec)
	fmt.Fprintf(&b, "  faults=%d: %s\n", total, strings.Join(faults, " "))
	if len(s.skipped) > 0 {
		var skipped []string
		n := 0
		for _, k := range slices.Sorted(maps.Keys(s.skipped)) {
			skipped = append(skipped, fmt.Sprintf("%s=%d", k, s.skipped[k]))
			n += s.skipped[k]
		}
		fmt.Fprintf(&b, "  skipped=%d (drawn, nothing to hit; the nemesis log says why): %s\n", n, strings.Join(skipped, " "))
	}
	fmt.Fprintf(&b, "  observed: worker-retries=%d pod-replacements=%d shard-failed-attempts=%d processor-requests=%d processor-redeliveries=%d processor-restarts=%d items-failed-visibly=%d\n",
		r.chunkRetries, r.replacements, r.failedAttempts, r.requests, r.redeliveries, r.processorRestarts, r.failedVisibly)
	fmt.Fprintf(&b, "  ledger server changes: noticed-by-shards=%d LedgerServerChanged-events=%d proofs-reported-not-on-a-standby=%d",
		r.serverChangesLogged, r.serverChangedEvents, r.proofsNotOnStandby)
	if s.cfg.Failovers {
		fmt.Fprintf(&b, " old-primary-shutdowns-made-immediate=%d", s.stoppedImmediately)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "  lost=%d double=%d count-mismatches=%d not-terminal=%d leaks=%d\n",
		len(r.lost), len(r.double), len(r.mismatch), len(r.notTerminal), len(r.leaks))
	failovers := 0
	if s.cfg.Failovers {
		failovers = 1
	}
	fmt.Fprintf(&b, "  replay: make soak SEED=%d DURATION=%s FAILOVERS=%d", s.cfg.Seed, s.cfg.Duration, failovers)
	return b.String()
}
