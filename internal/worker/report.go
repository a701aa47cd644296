package worker

import (
	"sync/atomic"
	"time"

	"github.com/runledger/runledger/api/v1alpha1"
)

// MaxFailures is how many failed items a report lists (the counts include
// them all).
const MaxFailures = 100

// Failure is one failed item.
type Failure struct {
	Entity     string `json:"entity"`
	Occurrence string `json:"occurrence"`
	Error      string `json:"error"`
	// Class is the error's SQLSTATE or runledger's class of it
	// (ledger.FailureClass), as the ledger records it.
	Class string `json:"class,omitempty"`
	// payload is the item's, whose digest the ledger records.
	payload []byte
}

// Report is what a shard did.
type Report struct {
	Shard int
	v1alpha1.ItemCounts
	// TotalKnown: Total is final (always, once the source is open: a query
	// source counts its shard's rows first).
	TotalKnown bool
	// Failures lists the first MaxFailures failed items.
	Failures []Failure
	// Done: every item of the shard has its outcome.
	Done bool
	// Interrupted: the shard was asked to stop (signal, cancelled context)
	// before it was done; the counts are exact for what it processed.
	Interrupted bool
	// TooManyFailures: more items failed than maxFailedItems allows; the shard
	// stopped taking chunks.
	TooManyFailures bool
	// WaitingForLock: another process holds the shard's lock (an earlier
	// pod still finishing) and the shard waits for it.
	WaitingForLock bool
	// WaitingForConnection: the database refused the shard a connection
	// (too many connections, 53300) and it waits to try again.
	WaitingForConnection bool
	// WaitingForStandby: the shard is proven and has waited standbyWaitSaid
	// for a standby of the ledger's server to have its proof
	// (ShardConfig.StandbyWait), and still waits.
	WaitingForStandby bool
	// Err is why the shard could not go on (the database stayed unreachable,
	// the source broke), not an item's failure.
	Err error
	// Proven: the counts are the ledger's, proven before the shard
	// reported success (ProveShard); Reproven counts the passes the shard
	// made again because the ledger did not hold what it had counted.
	Proven   bool
	Reproven int
	// ProvenByKey: the proof read every key of the batch again (the
	// ledger's server changed, or restarted, during the pass, or the shard
	// failed items); otherwise it proved the counts by the server's
	// unchanged life (ledger.ProveShard).
	ProvenByKey bool
	// Reprocessed counts the items the ledger did not hold at the end of a
	// pass, processed again in the next.
	Reprocessed int64
	// OnStandby says whether a standby of the ledger's server had flushed
	// the shard's proof when it reported (ShardConfig.StandbyWait): one of
	// the OnStandby values, "" when the server has no standby.
	OnStandby string
	// ServerChanges counts the ledger's sessions that reached another
	// server, or another life of it, than before (ledger.ServerChange), as
	// the shard saw them.
	ServerChanges int
	// Started and Elapsed time the shard.
	Started time.Time
	Elapsed time.Duration
	// Replication is what the ledger's server promises of a commit, as the
	// worker read it at start (Prepare); set by RunShard's caller for the
	// final report, nil when unknown.
	Replication *v1alpha1.LedgerReplication
}

// clone returns a copy that shares nothing mutable with r.
func (r Report) clone() Report {
	r.Failures = append([]Failure(nil), r.Failures...)
	return r
}

// FailureBudget counts failed items against maxFailedItems; shards that share
// one (all shards of `runledger run` in one process) stop together once the
// run as a whole has too many failures.
type FailureBudget struct {
	max    int64
	failed atomic.Int64
}

// NewFailureBudget allows max failed items (negative: unlimited).
func NewFailureBudget(max int) *FailureBudget { return &FailureBudget{max: int64(max)} }

func (b *FailureBudget) add(n int64) { b.failed.Add(n) }

// Exceeded reports whether more items failed than allowed.
func (b *FailureBudget) Exceeded() bool { return b.max >= 0 && b.failed.Load() > b.max }

// What a proven shard found of the ledger's standbys (Report.OnStandby).
const (
	// OnStandbyConfirmed: a standby had flushed the proof and every commit
	// before it: a failover to it keeps them (a failover manager promotes
	// the most advanced standby).
	OnStandbyConfirmed = "confirmed"
	// OnStandbyNotConfirmed: none had within the wait; a failover then
	// could lose the latest commits the proof read (runledger verify proves
	// the run again after one).
	OnStandbyNotConfirmed = "notConfirmed"
	// OnStandbyUnknown: the login may not read the standbys' positions
	// (pg_stat_replication shows them to pg_monitor), or they could not be
	// read.
	OnStandbyUnknown = "unknown"
)
