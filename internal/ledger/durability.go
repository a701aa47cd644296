package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Durability is what the ledger's server promises of a commit it
// acknowledges, as a worker's login reads it (Store.Durability): whether a
// synchronous standby has the commit by then, so that a failover to that
// standby keeps it.
//
// PostgreSQL's levels of synchronous_commit, with synchronous_standby_names
// naming at least one standby (and max_wal_senders above 0), are:
//
//   - remote_apply: the synchronous standbys have flushed the commit to disk
//     and replayed it (StandbyApplied).
//   - on (the default): they have flushed it to disk (StandbyFlushed).
//   - remote_write: they have received it and handed it to their operating
//     system, not flushed it (StandbyWritten): a crash of the standby's
//     PostgreSQL keeps it, a crash of its operating system at the time of
//     the failover can lose it.
//   - local: only the server itself has flushed it; a failover to a standby
//     can lose it (asynchronous replication).
//   - off: not even the server has flushed it; a crash of the server alone,
//     without failover, can lose the latest commits (up to three times
//     wal_writer_delay of them).
//
// With synchronous_standby_names empty every level but off is local: the
// commit waits for no standby, whatever standbys stream from the server.
type Durability struct {
	// SynchronousCommit is synchronous_commit as the login's sessions start
	// with it: what a chunk commits under (user SQL of the effect may lower
	// it for its own transaction with SET LOCAL). Behind a pooler it is the
	// value of the server connection the read got: one opened before an
	// ALTER ROLE keeps the old value until the pooler closes it.
	SynchronousCommit string
	// SynchronousStandbyNames is the server's synchronous_standby_names.
	SynchronousStandbyNames string
	// MaxWALSenders is the server's max_wal_senders: 0 serves no standby.
	MaxWALSenders int
	// InRecovery: the server is a standby (pg_is_in_recovery()), which
	// accepts no commit of the ledger's.
	InRecovery bool
}

// StandbyHas is how far a synchronous standby has a commit when the server
// acknowledges it.
type StandbyHas string

const (
	// StandbyNone: no standby is waited for (asynchronous replication, or
	// none).
	StandbyNone StandbyHas = ""
	// StandbyWritten: written to the standby's operating system, not
	// flushed (synchronous_commit = remote_write).
	StandbyWritten StandbyHas = "written"
	// StandbyFlushed: flushed to the standby's disk (synchronous_commit = on).
	StandbyFlushed StandbyHas = "flushed"
	// StandbyApplied: flushed and replayed on the standby
	// (synchronous_commit = remote_apply).
	StandbyApplied StandbyHas = "applied"
)

// Standby is how far a synchronous standby has a commit when the server
// acknowledges it: StandbyNone unless synchronous_standby_names names a
// standby, the server can serve one and synchronous_commit waits for one
// (PostgreSQL's SyncRepRequested and sync_standbys_defined).
func (d Durability) Standby() StandbyHas {
	if strings.TrimSpace(d.SynchronousStandbyNames) == "" || d.MaxWALSenders <= 0 {
		return StandbyNone
	}
	switch d.SynchronousCommit {
	case "remote_apply":
		return StandbyApplied
	case "on":
		return StandbyFlushed
	case "remote_write":
		return StandbyWritten
	}
	return StandbyNone // local, off
}

// Synchronous: the server acknowledges a commit only once a synchronous
// standby has it (Standby is not StandbyNone).
func (d Durability) Synchronous() bool { return d.Standby() != StandbyNone }

// LocalFlush: the server acknowledges a commit only once it has flushed it
// itself (synchronous_commit is not off).
func (d Durability) LocalFlush() bool { return d.SynchronousCommit != "off" }

// Verdict is the promise in a word: "synchronous" (Synchronous) or
// "asynchronous" (a failover can lose acknowledged commits).
func (d Durability) Verdict() string {
	if d.Synchronous() {
		return "synchronous"
	}
	return "asynchronous"
}

// Durability reads what the ledger's server promises of a commit, as this
// Store's login gets it (sqlDurability): any login can read it, directly or
// through a transaction pooler, on a primary or a standby.
func (s *Store) Durability(ctx context.Context) (Durability, error) {
	var d Durability
	err := pinnedTx(ctx, s.pool, sqlBeginPinnedReadOnly+`; `+s.sqlReadBounds(), func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, sqlDurability).Scan(&d.SynchronousCommit, &d.SynchronousStandbyNames, &d.MaxWALSenders, &d.InRecovery)
	})
	if err != nil {
		return Durability{}, fmt.Errorf("reading the server's synchronous_commit and synchronous_standby_names: %w", err)
	}
	return d, nil
}

// Standbys is where the server's standbys are against a WAL position
// (Store.AwaitStandby): a commit before Position survives a failover to a
// standby that has flushed it, and a failover manager promotes the most
// advanced standby.
type Standbys struct {
	// Position is the server's WAL position when it was read (after what
	// the caller wants kept: a shard's last commit and its proof).
	Position string
	// Streaming counts the standbys (walsenders) the server serves; Flushed
	// those that have flushed its WAL up to Position, Disconnected ones
	// included; Hidden those whose position the login may not read
	// (pg_stat_replication shows it only to roles with pg_read_all_stats,
	// which pg_monitor has).
	Streaming, Flushed, Hidden int
	// Disconnected counts the physical replication slots no walsender
	// streams from: standbys the server keeps WAL for that are not
	// connected now (cut off, restarting, or about to be promoted).
	Disconnected int
}

// Settled: nothing more to wait for: the server has no standby, streaming
// or kept a slot for, one has flushed Position, or every standby is
// streaming and the login may read the position of none of them.
func (st Standbys) Settled() bool {
	return st.Streaming+st.Disconnected == 0 || st.Flushed > 0 || st.Disconnected == 0 && st.Hidden == st.Streaming
}

// ErrServerChanged: the Store's sessions reached another server, or
// another life of it, while AwaitStandby waited (ServerChanges, or the
// wait's own reads): a WAL position read on one server means nothing on
// another, and what was read on the one before may be lost.
var ErrServerChanged = errors.New("the ledger's sessions reached another server, or a restarted one, while waiting for a standby (a failover?)")

// AwaitStandby reads the server's WAL position (a primary's: every commit
// acknowledged before is there) and waits, at most within, for one of its
// standbys to have flushed it (Settled), polling pg_stat_replication. It
// returns what it read last; a wait that ran out is no error. Once the
// Store's sessions reached another server, or another life of it, than on
// (the server the caller's proof was read on; when on is not Known, than
// when the wait began) it trusts no read and returns ErrServerChanged: a
// promoted standby has no standby of its own yet, and Settled would say
// so of a position it never had. Each read of the wait reads the server's
// identity in its own transaction too: behind a pooler a failover opens no
// new session of the Store's pool (the pooler's own sessions reach the
// promoted server), so the pool's watch (ServerChanges) does not see it.
func (s *Store) AwaitStandby(ctx context.Context, within time.Duration, on ServerIdentity) (Standbys, error) {
	changes := s.ServerChanges().Changes
	changed := func() bool { return s.ServerChanges().Changes != changes }
	lsn, err := s.walPosition(ctx, on)
	if err != nil {
		return Standbys{}, err
	}
	st := Standbys{Position: lsn}
	if changed() {
		return st, ErrServerChanged
	}
	var readErr error
	err = wait.PollUntilContextTimeout(ctx, 25*time.Millisecond, within, true, func(waitCtx context.Context) (bool, error) {
		got, err := s.standbysHave(waitCtx, lsn, on)
		if changed() || errors.Is(err, ErrServerChanged) { // the read, if any, was another server's
			return false, ErrServerChanged
		}
		if err != nil {
			if waitCtx.Err() == nil { // not the wait running out mid-read
				readErr = err
			}
			return false, nil // a failover's moment: read again
		}
		st, readErr = got, nil
		return st.Settled(), nil
	})
	switch {
	case errors.Is(err, ErrServerChanged):
		return st, ErrServerChanged
	case ctx.Err() != nil:
		return st, fmt.Errorf("waiting for a standby to have the WAL up to %s: %w", lsn, ctx.Err())
	case err != nil && readErr != nil:
		return st, readErr
	}
	return st, nil
}

// onServer reads, in tx, whether its session reached on's life of its
// server (SameLife); ErrServerChanged when it did not. An on that is not
// Known is not checked.
func onServer(ctx context.Context, tx pgx.Tx, on ServerIdentity) error {
	if !on.Known() {
		return nil
	}
	now, err := scanServerIdentity(tx.QueryRow(ctx, sqlServerIdentity))
	if err != nil {
		return fmt.Errorf("reading which server the session reached: %w", err)
	}
	if !now.SameLife(on) {
		return ErrServerChanged
	}
	return nil
}

// walPosition reads where the server's WAL is now (a primary's: every commit
// acknowledged before is there), on on's server (onServer).
func (s *Store) walPosition(ctx context.Context, on ServerIdentity) (string, error) {
	var lsn string
	err := pinnedTx(ctx, s.pool, sqlBeginPinnedReadOnly+`; `+s.sqlReadBounds(), func(tx pgx.Tx) error {
		if err := onServer(ctx, tx, on); err != nil {
			return err
		}
		return tx.QueryRow(ctx, sqlWALPosition).Scan(&lsn)
	})
	if errors.Is(err, ErrServerChanged) {
		return "", ErrServerChanged
	}
	if err != nil {
		return "", fmt.Errorf("reading the server's WAL position: %w", err)
	}
	return lsn, nil
}

// standbysHave reads how many of the server's standbys have flushed its WAL
// up to position (walPosition), on on's server (onServer).
func (s *Store) standbysHave(ctx context.Context, position string, on ServerIdentity) (Standbys, error) {
	st := Standbys{Position: position}
	err := pinnedTx(ctx, s.pool, sqlBeginPinnedReadOnly+`; `+s.sqlReadBounds(), func(tx pgx.Tx) error {
		if err := onServer(ctx, tx, on); err != nil {
			return err
		}
		var slotsFlushed int
		err := tx.QueryRow(ctx, sqlStandbysHave, position).Scan(&st.Streaming, &st.Flushed, &st.Hidden, &st.Disconnected, &slotsFlushed)
		st.Flushed += slotsFlushed
		return err
	})
	if errors.Is(err, ErrServerChanged) {
		return Standbys{}, ErrServerChanged
	}
	if err != nil {
		return Standbys{}, fmt.Errorf("reading how far the server's standbys have its WAL: %w", err)
	}
	return st, nil
}
