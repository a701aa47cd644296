package worker

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/ledger"
)

// DefaultDrainTimeout is how long the chunk in flight may still take once the
// shard is told to stop. (The chunk size's default is the API's:
// v1alpha1.DefaultChunkSize.)
const DefaultDrainTimeout = 10 * time.Second

// DefaultStandbyWait is how long a proven shard waits for a standby of an
// asynchronous primary to have its proof: a standby streaming from a
// healthy primary is milliseconds behind, and one that is not may be
// about to be promoted (a failover manager takes tens of seconds to decide
// that a primary is gone: pg_auto_failover's and Patroni's defaults, 20 to
// 30 s, then the promotion), which the wait must see to prove the shard
// again on the server promoted.
const DefaultStandbyWait = 2 * time.Minute

// standbyWaitSaid is when a shard still waiting for a standby says so.
const standbyWaitSaid = 10 * time.Second

// ShardConfig is everything one shard needs.
type ShardConfig struct {
	// Run identifies the writer of every row; Run.Shard is the shard processed
	// and Run.UID decides which rows are this run's own (counted completed).
	Run    ledger.Run
	Shards int
	Source Source
	// Effect, Processor and OnExisting go to the ledger's insert path as
	// they are.
	Effect    string
	Processor ledger.Processor
	// ItemsPerCall and CallsInFlight bound the Processor's calls of a
	// chunk (ledger.ChunkOptions): 0 is one call for the chunk.
	ItemsPerCall, CallsInFlight int
	OnExisting                  ledger.OnExisting
	// FailOnPayloadChange (spec.onPayloadChange: Fail) counts an item
	// already handled by another run whose payload differs from the
	// committed row's as failed instead of already handled; either way it
	// is counted in PayloadChanged and nothing is written.
	FailOnPayloadChange bool
	// Timeouts bound every statement of a chunk (Effect, Lock) and the
	// batch query (Query, Lock); a zero one keeps the session's own, or the
	// ledger's default where the session has none. Network is the pool's.
	Timeouts  v1alpha1.RunTimeouts
	ChunkSize int
	// MaxFailedItems: once more items than this failed, the shard stops taking
	// chunks. Ignored when Budget is set (the budget has its own maximum).
	MaxFailedItems int
	Budget         *FailureBudget
	Retry          Backoff
	Limits         Limits
	// DrainTimeout bounds how long the chunk in flight may still take once
	// ctx is cancelled; after it, the chunk is rolled back (its fate may be
	// unknown: a later attempt counts whatever it committed as completed).
	DrainTimeout time.Duration
	// LockWait is how long to wait for the shard's lock while another process
	// holds it (0: fail at once with ErrShardBusy).
	LockWait time.Duration
	// StandbyWait bounds how long the shard, once proven, waits for a
	// standby of the ledger's server to have the proof (0:
	// DefaultStandbyWait; negative: no wait).
	StandbyWait time.Duration
	// Progress, if set, is called with the counts so far after every chunk
	// (and once before the first). It runs on the shard's goroutine.
	Progress func(Report)
	Log      logr.Logger
}

func (c ShardConfig) withDefaults() ShardConfig {
	if c.Shards <= 0 {
		c.Shards = 1
	}
	if c.ChunkSize <= 0 {
		c.ChunkSize = v1alpha1.DefaultChunkSize
	}
	if c.Budget == nil {
		c.Budget = NewFailureBudget(c.MaxFailedItems)
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.StandbyWait == 0 {
		c.StandbyWait = DefaultStandbyWait
	}
	if c.Log.GetSink() == nil {
		c.Log = logr.Discard()
	}
	return c
}

// RunShard processes one shard: it reads the shard's items from the source,
// and for each chunk asks the ledger which keys are already committed (the
// preload: only an optimisation), commits the others through the one insert
// path, and counts every item's outcome:
//
//   - completed: committed by this run, now or by an earlier attempt of it
//     (the ledger tells this run's rows apart by Run.UID);
//   - alreadyHandled: committed by another run, or a repeat, within the
//     batch, of a key counted once already; payloadChanged counts the keys
//     of the first kind the payload of one of whose copies differs from the
//     committed row's, once each (their copies failed instead with
//     cfg.FailOnPayloadChange);
//   - failed: the item could not be committed (its error is kept), or the
//     row could not become an item.
//
// Retryable database errors are retried with back-off (cfg.Retry); a chunk
// whose commit outcome is unknown is simply sent again. When ctx is
// cancelled, the shard takes no new chunk, lets the one in flight commit
// (within cfg.DrainTimeout) and returns a report marked Interrupted.
func RunShard(ctx context.Context, store *ledger.Store, cfg ShardConfig) Report {
	cfg = cfg.withDefaults()
	s := &shardRun{cfg: cfg, store: store, rep: Report{Shard: cfg.Run.Shard, Started: time.Now()}, serversBefore: store.ServerChanges().Changes}
	s.run(ctx)
	if !s.rep.Done && !errors.Is(s.rep.Err, ledger.ErrShardBusy) { // a busy shard's rows are another process's to report
		s.heldInLedger(ctx)
	}
	s.rep.Elapsed = time.Since(s.rep.Started)
	return s.rep
}

// heldReadTimeout bounds heldInLedger's read, made on the way out of a
// shard that stopped (perhaps because the ledger is unreachable).
const heldReadTimeout = 5 * time.Second

// heldInLedger makes the counts of a shard that stopped before its proof
// (failed, interrupted, too many failures) say what the ledger holds of it
// under the run's identity: as completed, its rows, which earlier attempts
// may have committed (a pod killed before it reported) while this one
// stopped before reading them again, or before reading anything (bad input
// found at the start), and without any commit a database failover lost; as
// its total, if this attempt never learnt it, the items of its batch kept in
// the database (or no less than it counts). The other counts stay as
// tallied, and all of them if the ledger cannot be read.
func (s *shardRun) heldInLedger(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(heldReadTimeout, s.cfg.DrainTimeout))
	defer cancel()
	h, err := s.store.HeldOfShard(ctx, s.cfg.Run)
	if err != nil {
		s.log().Info("the shard stopped, and what the ledger holds of it could not be read: its counts are as tallied", "error", err.Error())
		return
	}
	if h.Rows != s.rep.Completed {
		s.log().Info("the shard stopped; the ledger holds another number of its rows than it counted completed (committed by an earlier attempt, or lost with a failover): reporting the ledger's",
			"rows", h.Rows, "counted", s.rep.Completed)
		s.rep.Completed = h.Rows
	}
	if !s.rep.TotalKnown && h.BatchItems > 0 {
		s.rep.Total, s.rep.TotalKnown = h.BatchItems, true
	}
	// A static batch's items are not kept: a shard that failed before
	// opening it (its ConfigMap changed) knows no total, and reports at
	// least what it counts, never less.
	s.rep.Total = max(s.rep.Total, s.rep.Processed())
}

type shardRun struct {
	cfg   ShardConfig
	store *ledger.Store
	rep   Report
	// pass writes this processing's failure records; forget: the run has
	// records of an earlier pass, which the chunks' other verdicts replace.
	pass   ledger.Pass
	forget bool
	chunk  int
	// carry: the outcome of the last key of the previous chunk, for repeats
	// of it that start the next chunk.
	carry carried
	st    stream
	// opened: the stream fixBeforeLease opened, for the first pass.
	opened stream
	lease  *ledger.ShardLease
	// serversBefore: the store's ServerChanges when the shard started.
	serversBefore int
	// batchLost: the pass stopped because the batch went (errBatchLost).
	batchLost bool
	// serverClaims: the pass may still ask the server to claim a fresh
	// range (claimFresh); off once the server refused one. claimedOnServer:
	// the server claimed one this pass.
	serverClaims, claimedOnServer bool
	// server: the ledger's server as the pass began, before its first read
	// of the ledger (zero: unknown), for the pass's proof (ledger.Counted).
	// provenOn: the server the last proof was read on (zero: unknown), whose
	// standby awaitStandby waits for.
	server, provenOn ledger.ServerIdentity
}

type carried struct {
	ok     bool
	key    ledger.Key
	failed *Failure // nil: the key was committed (by someone)
	// pending: the key's copies so far, not counted yet (tallyChunk).
	pending *pending
}

// pending is a chunk's last group whose key another run holds: it is counted
// with the chunk that ends it, since later copies in the next chunk still
// count in its verdict.
type pending struct {
	key     ledger.Key
	first   ledger.Item // as firstCopies.firsts: the failure record's payload
	copies  int64
	changed bool // a copy's payload differs (onPayloadChange: Report)
}

func (s *shardRun) log() logr.Logger {
	return s.cfg.Log.WithValues("shard", s.cfg.Run.Shard)
}

func (s *shardRun) run(ctx context.Context) {
	// One process per shard: two would each count the other's rows as their
	// own completed ones (see ErrShardBusy).
	s.lease = s.store.ShardLease(s.cfg.Run.UID, s.cfg.Run.Shard)
	s.lease.OnTakenAgain(func() { s.log().Info(ledger.ErrLeaseTakenAgain.Error()) })
	if !s.fixBeforeLease(ctx) {
		return
	}
	defer func() {
		if s.opened != nil { // the lease was never taken
			s.opened.close()
		}
	}()
	defer s.lease.Release()
	if err := s.takeLease(ctx); err != nil {
		s.fail(ctx, fmt.Errorf("shard %d of run %s/%s: %w", s.cfg.Run.Shard, s.cfg.Run.Namespace, s.cfg.Run.Name, err))
		return
	}
	// Renewed meanwhile; every chunk's transaction checks it too.
	var lost atomic.Pointer[error]
	defer s.lease.Keep(ctx, func(err error) { lost.Store(&err) })()
	for pass := 1; ; pass++ {
		if !s.runPass(ctx, &lost) {
			if !s.batchLost || pass >= MaxProofPasses {
				return
			}
			s.log().Info("the run's batch is gone from the ledger while the shard read it (lost with a database failover?): fixing it again, whole, and processing it again", "pass", pass)
			s.rep.Reproven++
			s.restart()
			continue
		}
		again, err := s.proveDurably(ctx, pass)
		if err != nil {
			s.fail(ctx, fmt.Errorf("shard %d: %w", s.cfg.Run.Shard, err))
			return
		}
		if !again {
			s.rep.Done = true
			s.rep.WaitingForConnection = false
			s.progress()
			return
		}
		s.restart()
	}
}

// takeLease takes the shard's lease (again: a lease this process holds is
// renewed, one a failover lost with its row is taken anew), waiting while
// another process holds it, at most cfg.LockWait.
func (s *shardRun) takeLease(ctx context.Context) error {
	err := s.cfg.Retry.Do(ctx, "taking the shard's lease", s.onRetry("lease"), func(int) error {
		return s.lease.Acquire(ctx, s.cfg.LockWait, func() {
			// Say so: the controller and kubectl see why nothing moves.
			s.rep.WaitingForLock = true
			s.progress()
		})
	})
	s.rep.WaitingForLock, s.rep.WaitingForConnection = false, false
	return err
}

// streamOptions are the options of the shard's stream; copyBatch lets a
// query's batch be fixed on two of the shard's connections
// (ledger.BatchQuery.Copy).
func (s *shardRun) streamOptions(copyBatch bool) streamOptions {
	return streamOptions{
		run:          s.cfg.Run,
		heldPayloads: s.cfg.OnExisting == ledger.Supersede || s.cfg.FailOnPayloadChange,
		fetchSize:    s.cfg.ChunkSize,
		retry:        s.cfg.Retry,
		limits:       s.cfg.Limits,
		timeouts:     s.cfg.Timeouts,
		log:          s.log(),
		retried:      s.retried,
		copyBatch:    copyBatch,
	}
}

// fixBeforeLease fixes a query's batch before the shard takes its lease,
// where the fix may use both of the shard's connections, the query's and
// the one that copies its rows (docs/insert-path.md): the lease's renewals
// need the second only once it is taken. A batch already fixed (another
// shard's, an earlier attempt's) is only looked up; a query that fails
// fails the shard as its pass would. The first pass reads the stream
// opened here (s.opened): a fixed batch does not change, and every fetch
// checks its header again.
func (s *shardRun) fixBeforeLease(ctx context.Context) bool {
	q, ok := s.cfg.Source.(*QuerySource)
	if !ok || q.fromRun != nil {
		return true
	}
	st, err := q.open(ctx, s.store, s.cfg.Run.Shard, s.cfg.Shards, s.streamOptions(true))
	if err != nil {
		s.fail(ctx, fmt.Errorf("reading %s: %w", s.cfg.Source.describe(), err))
		return false
	}
	s.opened = st
	return true
}

// runPass reads the shard's batch once, chunk by chunk, and reports whether
// every item got its outcome (the counts still to be proven); a shard that
// stopped (interrupted, too many failures, an error) says why in its report.
func (s *shardRun) runPass(ctx context.Context, lost *atomic.Pointer[error]) bool {
	// Once per pass, under the lease: no other pass of the shard writes now.
	s.pass = ledger.Pass{Run: s.cfg.Run, ID: rand.Text(), Lease: s.lease}
	s.server = s.readServer(ctx)
	err := s.cfg.Retry.Do(ctx, "looking up earlier failure records", s.onRetry("failures"), func(int) error {
		var err error
		s.forget, err = s.store.RunHasFailures(ctx, s.cfg.Run.UID)
		return err
	})
	if err != nil {
		s.fail(ctx, fmt.Errorf("shard %d: %w", s.cfg.Run.Shard, err))
		return false
	}
	st, err := s.openStream(ctx)
	if err != nil {
		s.fail(ctx, fmt.Errorf("reading %s: %w", s.cfg.Source.describe(), err))
		return false
	}
	defer st.close()
	s.st = st
	s.serverClaims = s.cfg.Processor == nil && s.cfg.OnExisting != ledger.Supersede
	s.claimedOnServer = false
	s.rep.Total, s.rep.TotalKnown = st.total()
	s.rep.WaitingForConnection = false
	s.progress()

	for chunkNo := 1; ; chunkNo++ {
		if ctx.Err() != nil {
			s.rep.Interrupted = true
			return false
		}
		if s.cfg.Budget.Exceeded() {
			s.rep.TooManyFailures = true
			return false
		}
		if err := lost.Load(); err != nil {
			s.fail(ctx, fmt.Errorf("shard %d: %w", s.cfg.Run.Shard, *err))
			return false
		}
		s.chunk = chunkNo
		if s.claimFresh(ctx) {
			s.noticeServer()
			if s.rep.TotalKnown && s.rep.Processed() == s.rep.Total {
				return s.leaseHeld(ctx)
			}
			s.rep.WaitingForConnection = false
			s.progress()
			continue
		}
		chunk, err := readChunk(ctx, st, s.cfg.ChunkSize)
		s.rep.Total, s.rep.TotalKnown = st.total()
		if err != nil {
			s.fail(ctx, fmt.Errorf("reading %s: %w", s.cfg.Source.describe(), err))
			s.batchLost = errors.Is(err, errBatchLost)
			return false
		}
		if len(chunk) == 0 && s.carry.pending == nil {
			return s.leaseHeld(ctx)
		}
		if err := s.process(ctx, chunk); err != nil {
			s.fail(ctx, fmt.Errorf("processing chunk %d: %w", chunkNo, err))
			return false
		}
		s.noticeServer()
		if len(chunk) == 0 || s.rep.TotalKnown && s.rep.Processed() == s.rep.Total {
			return s.leaseHeld(ctx)
		}
		s.rep.WaitingForConnection = false
		s.progress()
	}
}

// openStream is the pass's stream of the shard's batch: the one
// fixBeforeLease opened, for the first pass, else the source opened now.
func (s *shardRun) openStream(ctx context.Context) (stream, error) {
	if st := s.opened; st != nil {
		s.opened = nil
		return st, nil
	}
	return s.cfg.Source.open(ctx, s.store, s.cfg.Run.Shard, s.cfg.Shards, s.streamOptions(false))
}

// readServer reads which server, and which life of it, the ledger's
// database is as the pass begins; unknown (the login may not read it, or
// a session failed), every key of the pass is proven again at its end.
func (s *shardRun) readServer(ctx context.Context) ledger.ServerIdentity {
	id, err := s.store.Server(ctx)
	if err != nil || !id.Known() {
		s.log().V(1).Info("which server the ledger's database is, and since when, is unknown: the shard's proof will read every key again", "error", errString(err))
		return ledger.ServerIdentity{}
	}
	return id
}

// noticeServer says so when the ledger's sessions reached another server,
// or another life of it, since the shard last looked (a failover or a
// restart the pool reconnected through): what the shard counted since may
// have been lost with the old one, and its proof at the end of the pass
// settles it.
func (s *shardRun) noticeServer() {
	c := s.store.ServerChanges()
	if c.Changes-s.serversBefore == s.rep.ServerChanges {
		return
	}
	s.rep.ServerChanges = c.Changes - s.serversBefore
	s.log().Info("the ledger's database is another server now, or restarted (a failover?): commits acknowledged before may be lost; the ledger proves this shard's counts before it reports them",
		"from", c.From.String(), "to", c.To.String())
}

// proveDurably proves the shard's counts (prove) and waits for a standby
// to have the proof (awaitStandby). A proof whose server the ledger's
// sessions left before a standby had it (a failover to a standby that may
// never have received what the proof read) is made again on the server
// there is now, which finds what was lost and has it processed again: a
// shard reports only counts proven on a server that still holds them, or
// on one no failover has left since. After MaxProofPasses proofs so left,
// the shard fails, proven of nothing.
func (s *shardRun) proveDurably(ctx context.Context, pass int) (bool, error) {
	for proofs := 1; ; proofs++ {
		changes := s.store.ServerChanges().Changes
		again, err := s.prove(ctx, pass)
		if err != nil || again {
			return again, err
		}
		if !s.awaitStandby(ctx, changes) {
			return false, nil
		}
		if proofs >= MaxProofPasses {
			return false, fmt.Errorf("the ledger's server changed %d times before a standby had the shard's proof: its counts are not proven", proofs)
		}
		s.rep.Proven, s.rep.OnStandby = false, ""
		s.log().Info("the ledger's database is another server now, or restarted (a failover?), and no standby was known to have the shard's proof before: proving the counts again on the server there is now",
			"provenOn", s.provenOn.String(), "from", s.store.ServerChanges().From.String(), "to", s.store.ServerChanges().To.String())
		// The lease's row may be lost with the server too: this process
		// holds it, or takes it anew, before the shard writes again.
		if err := s.takeLease(ctx); err != nil {
			return false, fmt.Errorf("taking the shard's lease again: %w", err)
		}
	}
}

// awaitStandby waits, once the shard is proven, for a standby of the
// ledger's server to have flushed the proof and every commit before it
// (ledger.AwaitStandby, at most cfg.StandbyWait): until then a failover to
// an asynchronous standby can lose the tail the proof read. It reports
// whether the ledger's sessions reached another server since changes (the
// pool's ServerChanges before the proof), or than the one the proof was
// read on (provenOn: behind a pooler, whose own sessions reach a promoted
// server, the pool's watch sees no failover): the proof must then be made
// again. Otherwise it says what it found in the log and the report
// (OnStandby), and never fails the shard. A server that does not answer
// is asked again, from a new session, until the wait is over: the session
// that reaches a promoted standby is the one that tells.
func (s *shardRun) awaitStandby(ctx context.Context, changes int) (serverChanged bool) {
	if s.cfg.StandbyWait < 0 {
		return false
	}
	start := time.Now()
	deadline := start.Add(s.cfg.StandbyWait)
	var st ledger.Standbys
	var err error
	for said := false; ; {
		within := time.Until(deadline)
		if within <= 0 { // after a pause for a server that did not answer
			break
		}
		if !said {
			within = min(within, standbyWaitSaid)
		}
		st, err = s.store.AwaitStandby(ctx, within, s.provenOn)
		if errors.Is(err, ledger.ErrServerChanged) || s.store.ServerChanges().Changes != changes {
			s.rep.WaitingForStandby = false
			return true
		}
		if ctx.Err() != nil || time.Until(deadline) <= 0 || err == nil && st.Settled() {
			break
		}
		if err == nil && !said {
			said = true
			s.rep.WaitingForStandby = true // said in the status too: the shard shows no progress meanwhile
			s.progress()
			s.log().Info("waiting for a standby of the ledger's server to have the shard's proof, or for a failover to prove the counts again on the server promoted",
				"waited", time.Since(start).Round(time.Millisecond).String(), "waitingAtMost", s.cfg.StandbyWait.String(), "walPosition", st.Position, "standbys", st.Streaming, "disconnectedStandbys", st.Disconnected)
			continue
		}
		if err != nil { // the server did not answer: a failover's moment
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	s.rep.OnStandby, s.rep.WaitingForStandby = onStandby(st, err), false
	switch s.rep.OnStandby {
	case OnStandbyNotConfirmed:
		s.log().Info("no standby of the ledger's server has the shard's proof yet: a failover now could lose the latest commits it proved (runledger verify proves the run again after one)",
			"waited", time.Since(start).Round(time.Millisecond).String(), "walPosition", st.Position, "standbys", st.Streaming, "disconnectedStandbys", st.Disconnected)
	case OnStandbyUnknown:
		msg := "whether a standby of the ledger's server has the shard's proof is unknown: the login may not read the standbys' positions (grant it pg_monitor)"
		if err != nil {
			msg = "whether a standby of the ledger's server has the shard's proof is unknown"
		}
		s.log().Info(msg, "standbys", st.Streaming, "error", errString(err))
	case OnStandbyConfirmed:
		s.log().V(1).Info("a standby of the ledger's server has the shard's proof", "walPosition", st.Position,
			"waited", time.Since(start).Round(time.Millisecond).String())
	}
	return false
}

// onStandby says in a word what AwaitStandby found (Report.OnStandby).
func onStandby(st ledger.Standbys, err error) string {
	switch {
	case err != nil && st.Position == "":
		return OnStandbyUnknown
	case st.Streaming+st.Disconnected == 0 && err == nil:
		return ""
	case st.Flushed > 0:
		return OnStandbyConfirmed
	case err != nil || st.Disconnected == 0 && st.Hidden == st.Streaming:
		return OnStandbyUnknown
	}
	return OnStandbyNotConfirmed
}

// leaseHeld checks, at the end of a pass, that the shard's lease says its
// counts are its own: a chunk settled by the fetch's lookup alone wrote
// nothing, so no transaction checked the lease for it.
func (s *shardRun) leaseHeld(ctx context.Context) bool {
	if err := s.cfg.Retry.Do(ctx, "renewing the shard's lease", s.onRetry("lease"), func(int) error {
		return s.lease.Check(ctx)
	}); err != nil {
		s.fail(ctx, fmt.Errorf("shard %d: %w", s.cfg.Run.Shard, err))
		return false
	}
	return true
}

// MaxProofPasses bounds how many times a shard processes its batch again
// because the ledger did not hold what it had counted (commits a database
// failover lost): each pass processes only what is missing.
const MaxProofPasses = 3

// prove has the ledger prove the counts of the pass just ended, and
// reports whether the shard must process its batch again: the ledger does
// not hold some items it counted (their commits lost with a database that
// failed over) or the batch it read. Once proven, the report's counts are
// the ledger's; a ledger that contradicts itself, or still misses items
// after MaxProofPasses, is the shard's error: it never reports success.
func (s *shardRun) prove(ctx context.Context, pass int) (bool, error) {
	kept, keys := s.st.proofKeys()
	var p ledger.RunProof
	err := s.cfg.Retry.Do(ctx, "proving the shard's counts from the ledger", s.onRetry("proof"), func(int) error {
		var err error
		p, err = s.store.ProveShard(ctx, s.cfg.Run.UID, s.cfg.Run.Shard, kept, keys, &ledger.Counted{Server: s.server, ItemCounts: s.rep.ItemCounts})
		return err
	})
	if err != nil {
		return false, err
	}
	tallied := s.rep.ItemCounts
	lost := p.Missing > 0 || p.Total != tallied.Total
	switch {
	case lost && pass < MaxProofPasses:
		s.log().Info("the ledger does not hold items this shard counted (their commits were lost, as in a database failover that lost the tail of its log): processing the batch again; what the ledger holds is not repeated",
			"pass", pass, "missing", p.Missing, "batchItems", p.Total, "counted", tallied.Total)
		s.rep.Reproven++
		s.rep.Reprocessed += p.Missing + max(tallied.Total-p.Total, 0)
		return true, nil
	case lost:
		return false, fmt.Errorf("the ledger still does not hold %d of the %d items the shard counted after %d passes: its counts are not proven", p.Missing+max(tallied.Total-p.Total, 0), tallied.Total, pass)
	case !p.Proven():
		return false, fmt.Errorf("the ledger's records of %d keys of the shard contradict each other or the batch (runledger verify lists them): its counts are not proven", p.Mismatched+max(p.Unmatched-p.BadRows, 0))
	}
	if p.Completed != tallied.Completed || p.AlreadyHandled != tallied.AlreadyHandled || p.Failed != tallied.Failed {
		s.log().Info("the ledger proves other counts than the shard tallied: reporting the ledger's",
			"completed", p.Completed, "alreadyHandled", p.AlreadyHandled, "failed", p.Failed,
			"talliedCompleted", tallied.Completed, "talliedAlreadyHandled", tallied.AlreadyHandled, "talliedFailed", tallied.Failed)
	}
	s.rep.Completed, s.rep.AlreadyHandled, s.rep.Failed = p.Completed, p.AlreadyHandled, p.Failed
	s.rep.Proven, s.rep.ProvenByKey = true, !p.Counted
	s.provenOn = p.Server
	how := "by its server's unchanged life (nothing committed or read since the pass began can be lost), the batch read again"
	if !p.Counted {
		how = "key by key"
	}
	s.log().V(1).Info("the ledger proved the shard's counts", "how", how)
	return false, nil
}

// restart readies the shard for another pass over its batch: the counts
// start again (the failure budget forgets the shard's), the records of this
// pass become an earlier pass's.
func (s *shardRun) restart() {
	s.rep.Err, s.batchLost = nil, false
	s.cfg.Budget.add(-s.rep.Failed)
	s.rep.ItemCounts = v1alpha1.ItemCounts{}
	s.rep.Failures = nil
	s.carry = carried{}
	s.chunk = 0
}

// fail records why the shard stopped: an interruption when ctx was
// cancelled, an error otherwise.
func (s *shardRun) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		s.rep.Interrupted = true
		return
	}
	s.rep.Err = err
}

func (s *shardRun) progress() {
	if s.cfg.Progress != nil {
		s.cfg.Progress(s.rep.clone())
	}
}

// freshClaimer is a stream whose next positions the server can claim
// without them coming to the worker (queryStream).
type freshClaimer interface {
	// freshRange is the reader and the positions the next chunk of size
	// would read, when the server may claim them.
	freshRange(size int) (r *ledger.BatchReader, pos int64, n int, ok bool)
	// claimedFresh moves past n positions the server claimed, the last of
	// which holds last.
	claimedFresh(ctx context.Context, n int, last ledger.Key)
}

// claimFresh has the server claim the shard's next chunk when the stream
// expects its keys fresh (a fetch that looked them up found none held) and
// the run needs no item in the worker: no processor, no Supersede
// (serverClaims), no earlier failure records to replace, no key pending
// from the chunk before. An SQL effect runs over the chunk's items in the
// same transaction. It reports whether it did: every item of the chunk
// committed, Completed. Otherwise nothing of it committed and the chunk is
// read and claimed as any other: after a held key with its keys looked up
// again, after a refusal (an item the server's stricter check would not
// take, or a range not whole) or an error (the effect's among them: the
// worker isolates its failing items), for the rest of the pass without
// asking the server again. The worker's own claim then decides every item,
// as if this had not run.
func (s *shardRun) claimFresh(ctx context.Context) bool {
	fc, ok := s.st.(freshClaimer)
	if !ok || !s.serverClaims || s.forget || s.carry.pending != nil {
		return false
	}
	r, pos, n, ok := fc.freshRange(s.cfg.ChunkSize)
	if !ok {
		return false
	}
	work, stop := s.drainContext(ctx)
	defer stop()
	got, err := r.ClaimFresh(work, s.cfg.Run, pos, n, v1alpha1.MaxKeyPartBytes, s.cfg.Limits.MaxPayload(), ledger.ChunkOptions{
		Effect: s.cfg.Effect, Lease: s.lease, EffectTimeout: s.cfg.Timeouts.Effect, LockTimeout: s.cfg.Timeouts.Lock, NetworkTimeout: s.cfg.Timeouts.Network,
	})
	switch {
	case err != nil:
		s.serverClaims = false
		s.log().V(1).Info("the server did not claim a fresh chunk; the worker claims the rest of the pass itself", "chunk", s.chunk, "error", err.Error())
	case got.Claimed:
		if !s.claimedOnServer {
			s.claimedOnServer = true
			s.log().V(1).Info("the server claims the shard's fresh chunks: their items do not come to the worker", "chunk", s.chunk)
		}
		fc.claimedFresh(ctx, n, got.Last)
		s.settle(tally{counts: v1alpha1.ItemCounts{Completed: int64(n)}, carry: carried{ok: true, key: got.Last}})
		return true
	case got.Held:
		s.st.sawHeld(true)
	default:
		s.serverClaims = false
		s.log().V(1).Info("the server refused to claim a fresh chunk (an item its check does not take); the worker claims the rest of the pass itself", "chunk", s.chunk)
	}
	return false
}

// readChunk reads up to size entries; an empty chunk means the end.
func readChunk(ctx context.Context, st stream, size int) ([]entry, error) {
	chunk := make([]entry, 0, size)
	for len(chunk) < size {
		e, err := st.next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		chunk = append(chunk, e)
	}
	return chunk, nil
}

// tally is one chunk's outcome, added to the report only once the chunk is
// settled, so that a chunk abandoned mid-way counts nothing.
type tally struct {
	counts   v1alpha1.ItemCounts
	failures []Failure
	carry    carried
	// flushed: the previous chunk's pending key, counted by this chunk
	// although none of its copies is in it.
	flushed *ledger.Key
}

func (t *tally) completed()      { t.counts.Completed++ }
func (t *tally) alreadyHandled() { t.counts.AlreadyHandled++ }

func (t *tally) failed(f Failure) {
	t.counts.Failed++
	t.failures = append(t.failures, f)
}

// process settles one chunk: its copies grouped by key with what the fetch
// found, the ledger's verdict of every key (ledger.Store.Settle: the
// preload, the claim with its retries, the outcomes), and their tally. An
// empty chunk ends the batch: it counts the last group if it waited
// (carried.pending).
func (s *shardRun) process(ctx context.Context, chunk []entry) error {
	work, stop := s.drainContext(ctx)
	defer stop()
	g := groupFirstCopies(chunk, s.carry.pending != nil)
	settled, err := s.store.Settle(work, s.cfg.Run, g.groups, ledger.SettleOptions{
		ChunkOptions: ledger.ChunkOptions{
			Effect: s.cfg.Effect, Processor: s.cfg.Processor, OnExisting: s.cfg.OnExisting, Lease: s.lease,
			ItemsPerCall: s.cfg.ItemsPerCall, CallsInFlight: s.cfg.CallsInFlight,
			ExpectFresh:   g.fresh,
			EffectTimeout: s.cfg.Timeouts.Effect, LockTimeout: s.cfg.Timeouts.Lock, NetworkTimeout: s.cfg.Timeouts.Network,
		},
		FailOnPayloadChange: s.cfg.FailOnPayloadChange,
		Retry:               s.retry(ctx),
		Stop:                func() error { return stopCause(ctx) },
	})
	if err != nil {
		return err
	}
	s.st.sawHeld(settled.ClaimFoundHeld)
	t, err := s.tallyChunk(chunk, g, settled.Decisions)
	if err != nil {
		return err
	}
	if err := s.record(ctx, work, chunk, t); err != nil {
		return err
	}
	s.settle(t)
	return nil
}

// retry is the shard's back-off for the ledger's steps, until ctx is done.
func (s *shardRun) retry(ctx context.Context) ledger.Retry {
	return func(step string, retryable func(error) bool, try func(int) error) error {
		return s.cfg.Retry.DoWhile(ctx, step, retryable, s.onRetry(step), try)
	}
}

// record writes the chunk's failed items to the ledger database, exactly the
// items its tally counts failed, and forgets the earlier passes' records of
// the chunk's other keys (only when the run has such records): a failure is
// never known only to a log. Nothing is written for a chunk without failures
// on a run without records: no round trip on that path.
func (s *shardRun) record(ctx, work context.Context, chunk []entry, t tally) error {
	failed := make([]ledger.FailedItem, len(t.failures))
	isFailed := make(map[ledger.Key]bool, len(t.failures))
	for i, f := range t.failures {
		k := ledger.Key{Entity: f.Entity, Occurrence: f.Occurrence}
		failed[i] = ledger.FailedItem{Key: k, Payload: f.payload, Class: f.Class, Error: f.Error}
		isFailed[k] = true
	}
	var settled []ledger.Key
	if s.forget {
		if k := t.flushed; k != nil && !isFailed[*k] {
			settled = append(settled, *k)
		}
		for _, e := range chunk {
			k := e.item.Key
			if p := t.carry.pending; e.bad != nil || isFailed[k] || p != nil && p.key == k { // a pending key is the chunk's that counts it
				continue
			}
			if len(settled) == 0 || settled[len(settled)-1] != k {
				settled = append(settled, k)
			}
		}
	}
	if len(failed) == 0 && len(settled) == 0 {
		return nil
	}
	return s.cfg.Retry.Do(ctx, "recording failed items", s.onRetry("failures"), func(int) error {
		return s.store.RecordVerdicts(work, s.pass, s.chunk, failed, settled)
	})
}

// drainContext is the context of the chunk in flight: it may finish after
// ctx is cancelled, within the drain timeout; waits between retries end as
// soon as ctx is cancelled.
func (s *shardRun) drainContext(ctx context.Context) (context.Context, func()) {
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopDrain := context.AfterFunc(ctx, func() {
		t := time.NewTimer(s.cfg.DrainTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-work.Done():
		}
	})
	return work, func() { stopDrain(); cancel() }
}

// firstCopies is a chunk grouped by key: a group per key, in order, each
// its first copy and the later copies that follow it (a key's copies are
// adjacent). Every copy of a key counts in its verdict: the lookups of all
// of them, and the claim, or the preload, compares every payload they did
// not settle.
type firstCopies struct {
	// groups[i] is group i as the ledger settles it: its item as the claim
	// is sent it (its key and its first copy's payload or, when the fetch
	// left that out, the lookup having found it the same as the holding
	// row's, its first other copy's), its later copies whose payload the
	// claim (or the preload) compares besides (those the lookups did not
	// settle, other than the item's bytes), and what the lookups found
	// (by index, not a map by key: a chunk of an already handled batch is
	// all held, and hashing every key was a sixth of a shard's CPU).
	groups []ledger.Group
	// firstIdx maps an entry of the chunk to its group, or -1 (a bad entry,
	// or a repeat of the previous chunk's last key).
	firstIdx []int
	// fresh: no lookup found a key held by another run whose payloads it
	// could not compare (ledger.ChunkOptions.ExpectFresh).
	fresh bool
	// cont: group 0 is the chunk's leading repeats of the previous chunk's
	// last key, whose copies are not counted yet (carried.pending).
	cont bool
}

// hold records what a lookup found of group i's key.
func (g *firstCopies) hold(i int, h ledger.Held) {
	g.fresh = g.groups[i].Know(h) && g.fresh
}

// lookups is what the entries of one group say of its key.
type lookups struct {
	all     bool        // every entry was looked up (checked)
	agree   bool        // and all found the same holder
	h       ledger.Held // the first checked entry's, payloads merged (ledger.MergeMatch)
	checked bool        // some entry was looked up
	static  bool        // the source asks the preload (neither checked nor direct)
	hasItem bool        // the group's item has a payload the fetch did not leave out
}

func (l *lookups) add(e entry) {
	switch {
	case e.checked:
		h := ledger.Held{Holder: e.holder, Payload: e.payload}
		switch {
		case !l.checked:
			l.h, l.agree = h, true
		case h.Holder != l.h.Holder:
			l.agree = false
		default:
			l.h.Payload = ledger.MergeMatch(l.h.Payload, h.Payload)
		}
		l.checked = true
	case !e.direct:
		l.static, l.all = true, false
	default:
		l.all = false
	}
}

// close settles what group i's lookups say: a payload that differs settles
// it (already handled, changed); lookups of every copy that agree settle it
// as they say; anything else is for the preload (a static source) or the
// claim.
func (g *firstCopies) close(i int, l lookups) {
	switch {
	case l.static:
		g.groups[i].Unchecked = true
	case l.checked && l.h.Holder == ledger.HolderOtherRun && l.h.Payload == ledger.PayloadDiffers:
		g.hold(i, l.h)
	case l.all && l.agree:
		g.hold(i, l.h)
	case l.checked && (l.h.Holder != ledger.HolderNone || !l.agree):
		g.fresh = false // held when looked up: the claim will find it so
	}
}

// groupFirstCopies groups chunk by key; continues: leading repeats continue
// the previous chunk's last group, not counted yet (carried.pending), and
// are a group of their own (cont), compared like any other.
func groupFirstCopies(chunk []entry, continues bool) firstCopies {
	g := firstCopies{groups: make([]ledger.Group, 0, len(chunk)), firstIdx: make([]int, len(chunk)), fresh: true}
	last := -1
	var l lookups
	for i, e := range chunk {
		g.firstIdx[i] = -1
		switch {
		case e.bad != nil:
		case !e.repeat || (last < 0 && continues):
			if last >= 0 {
				g.close(last, l)
			}
			g.cont = g.cont || e.repeat
			last = len(g.groups)
			g.groups = append(g.groups, ledger.Group{Item: e.item})
			g.firstIdx[i] = last
			l = lookups{all: true, hasItem: !e.omitted}
			l.add(e)
		case last >= 0:
			g.firstIdx[i] = last
			l.add(e)
			g.addCopy(last, &l, e)
		}
	}
	if last >= 0 {
		g.close(last, l)
	}
	return g
}

// addCopy keeps a later copy of group i for the claim to compare, unless
// the fetch left its payload out (the lookup found it the same) or it is
// the group item's, byte for byte; the first one the fetch did not leave
// out stands for a first copy it did.
func (g *firstCopies) addCopy(i int, l *lookups, e entry) {
	grp := &g.groups[i]
	switch p := e.item.Payload; {
	case e.omitted:
	case !l.hasItem:
		grp.Item.Payload, l.hasItem = p, true
	case (p == nil) == (grp.Item.Payload == nil) && bytes.Equal(p, grp.Item.Payload):
	default:
		grp.Copies = append(grp.Copies, e.item)
	}
}

// verdictOf is the worker's form of the ledger's verdict v of item it: a
// Failed one with its failure record.
func verdictOf(it ledger.Item, v ledger.Decision) verdict {
	out := verdict{outcome: v.Outcome, payloadChanged: v.PayloadChanged}
	if v.Outcome == ledger.Failed {
		out.failure = &Failure{Entity: it.Entity, Occurrence: it.Occurrence, Error: errString(v.Err), Class: v.Class, payload: it.Payload}
	}
	return out
}

// verdict is the outcome of a group: its key's.
type verdict struct {
	outcome        ledger.Outcome
	payloadChanged bool     // already handled by another run, with another payload
	failure        *Failure // outcome Failed
}

// defers says whether a chunk's last group, of verdict v, waits for the
// next chunk to be counted: another run holds its key, so its copies there
// may still change its verdict (a payload that differs, one the claim
// cannot cast). A Supersede run compares no payload.
func (s *shardRun) defers(v verdict) bool {
	return v.outcome == ledger.AlreadyHandled && s.cfg.OnExisting != ledger.Supersede
}

// tallyChunk counts the chunk's outcomes, in the chunk's order, from the
// ledger's verdict of each group; a group continued from the previous chunk
// (g.cont) and one the next chunk may continue are counted whole, with the
// chunk that ends them. An empty chunk ends the batch.
func (s *shardRun) tallyChunk(chunk []entry, g firstCopies, decided []ledger.Decision) (tally, error) {
	t := tally{carry: s.carry}
	if len(decided) != len(g.groups) {
		return tally{}, fmt.Errorf("internal error: the ledger decided %d verdicts for %d keys", len(decided), len(g.groups))
	}
	verdicts := make([]verdict, len(g.groups))
	for i, grp := range g.groups {
		verdicts[i] = verdictOf(grp.Item, decided[i])
	}
	p := t.carry.pending
	switch {
	case p == nil:
	case g.cont: // the chunk goes on with its copies: the key's verdict is theirs there and here
		verdicts[0] = s.merge(*p, verdicts[0])
	case len(g.groups) > 0 || len(chunk) == 0: // another key follows, or the batch ended: its verdict stands
		t.countGroup(p.first, p.copies, verdict{outcome: ledger.AlreadyHandled, payloadChanged: p.changed})
		t.flushed, t.carry.pending = &p.key, nil
	}
	tail := len(g.groups) - 1
	deferTail := tail >= 0 && s.defers(verdicts[tail])
	whole := [2]int64{} // entries of group 0 (continued) and of the tail (deferred)
	for i, e := range chunk {
		gi := g.firstIdx[i]
		switch {
		case e.bad != nil:
			t.failed(Failure{Entity: e.item.Entity, Occurrence: e.item.Occurrence, Error: e.bad.Error(),
				Class: ledger.ClassInput, payload: e.item.Payload})
		case gi < 0:
			// A repeat of the last key of the previous chunk, counted there.
			if !t.carry.ok || t.carry.key != e.item.Key || t.carry.pending != nil {
				return tally{}, fmt.Errorf("internal error: repeat of %s without its first copy", e.item.Key)
			}
			s.countRepeat(&t, e.item, t.carry.failed)
		case gi == tail && deferTail:
			whole[1]++
		case gi == 0 && g.cont:
			whole[0]++
		case !e.repeat:
			t.count(verdicts[gi])
		default:
			s.countRepeat(&t, e.item, verdicts[gi].failure)
		}
	}
	if g.cont && (!deferTail || tail != 0) {
		t.countGroup(p.first, p.copies+whole[0], verdicts[0])
	}
	// The carry: the chunk's last key, waiting or counted.
	switch {
	case deferTail && g.cont && tail == 0:
		t.carry.pending = &pending{key: p.key, first: p.first, copies: p.copies + whole[1], changed: verdicts[0].payloadChanged}
	case deferTail:
		k := g.groups[tail].Item.Key
		t.carry = carried{ok: true, key: k, pending: &pending{key: k, first: g.groups[tail].Item, copies: whole[1], changed: verdicts[tail].payloadChanged}}
	case tail >= 0:
		t.carry = carried{ok: true, key: g.groups[tail].Item.Key, failed: verdicts[tail].failure}
	}
	return t, nil
}

// merge is the verdict of a key whose copies p, counted nowhere yet, another
// run held, and whose later copies' group has verdict v: v, changed if p's
// payloads were (the ledger's rule, ledger.OnPayloadChange).
func (s *shardRun) merge(p pending, v verdict) verdict {
	if v.outcome != ledger.AlreadyHandled {
		return v
	}
	return verdictOf(p.first, ledger.OnPayloadChange(ledger.Decision{Outcome: v.outcome, PayloadChanged: v.payloadChanged || p.changed}, s.cfg.FailOnPayloadChange))
}

// count counts a group's first copy, of verdict v.
func (t *tally) count(v verdict) {
	switch v.outcome {
	case ledger.Completed:
		t.completed()
	case ledger.AlreadyHandled:
		t.alreadyHandled()
	default:
		t.failed(*v.failure)
	}
	if v.payloadChanged {
		t.counts.PayloadChanged++
	}
}

// countGroup counts n copies of a key whose first copy is first, of verdict
// v, at once.
func (t *tally) countGroup(first ledger.Item, n int64, v verdict) {
	if n == 0 {
		return
	}
	if v.failure != nil {
		f := *v.failure
		f.Entity, f.Occurrence, f.payload = first.Entity, first.Occurrence, first.Payload
		v.failure = &f
	}
	t.count(v)
	for range n - 1 {
		if v.failure == nil {
			t.alreadyHandled()
			continue
		}
		t.failed(repeatOf(ledger.Item{Key: first.Key}, v.failure)) // its payload is not kept: the record keeps the first copy's
	}
}

// settle adds a settled chunk's tally to the shard's report.
func (s *shardRun) settle(t tally) {
	s.carry = t.carry
	s.rep.Completed += t.counts.Completed
	s.rep.AlreadyHandled += t.counts.AlreadyHandled
	s.rep.Failed += t.counts.Failed
	s.rep.PayloadChanged += t.counts.PayloadChanged
	for _, f := range t.failures {
		if len(s.rep.Failures) >= MaxFailures {
			break
		}
		s.rep.Failures = append(s.rep.Failures, f)
	}
	s.cfg.Budget.add(t.counts.Failed)
}

// countRepeat counts a later copy of a key: already handled (its first copy
// was counted), or failed like its first copy.
func (s *shardRun) countRepeat(t *tally, it ledger.Item, first *Failure) {
	if first == nil {
		t.alreadyHandled()
		return
	}
	t.failed(repeatOf(it, first))
}

// repeatOf is the failure of it, a later copy of a key whose first copy
// failed with first.
func repeatOf(it ledger.Item, first *Failure) Failure {
	return Failure{Entity: it.Entity, Occurrence: it.Occurrence, Error: "repeat of a failed item: " + first.Error,
		Class: first.Class, payload: it.Payload}
}

func (s *shardRun) onRetry(what string) func(int, time.Duration, error) {
	return func(attempt int, wait time.Duration, err error) {
		s.log().Info("retrying after a retryable error", "step", what, "retry", attempt, "wait", wait.Round(time.Millisecond).String(), "error", err.Error())
		s.retried(err)
	}
}

// retried reports, once, that the database refuses the shard a connection
// (too many connections): the run's status shows why nothing moves.
func (s *shardRun) retried(err error) {
	if ledger.IsTooManyConnections(err) && !s.rep.WaitingForConnection {
		s.rep.WaitingForConnection = true
		s.progress()
	}
}

func errString(err error) string {
	if err == nil {
		return "failed (no error given)"
	}
	return err.Error()
}
