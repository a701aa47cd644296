package ledger

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ServerIdentity is which PostgreSQL server, and which life of it, a
// session reached: a restart changes Started, a promoted standby the
// timeline (and usually the address), a crash the server recovered from
// without a restart of its postmaster Reset (recovery discards the
// cumulative statistics and starts them again). Each may have lost commits
// the old life acknowledged (an asynchronous standby's missing tail; a crash
// with synchronous_commit off); while all stay the same, the server has not
// lost a committed row.
type ServerIdentity struct {
	Address  string    // inet_server_addr and port; "" over a Unix socket
	Started  time.Time // pg_postmaster_start_time()
	Timeline uint32    // the WAL's timeline; 0 on a standby (in recovery)
	Reset    time.Time // pg_stat_bgwriter.stats_reset: a crash recovery's time, or a reset by hand
}

// Known reports whether id tells a life of a primary apart: read whole,
// from a server that is not in recovery.
func (id ServerIdentity) Known() bool {
	return !id.Started.IsZero() && id.Timeline != 0 && !id.Reset.IsZero()
}

func (id ServerIdentity) String() string {
	if id == (ServerIdentity{}) {
		return "unknown"
	}
	where := id.Address
	if where == "" {
		where = "local socket"
	}
	tl := "in recovery"
	if id.Timeline != 0 {
		tl = fmt.Sprintf("timeline %d", id.Timeline)
	}
	return fmt.Sprintf("%s, %s, started %s, statistics since %s", where, tl,
		id.Started.UTC().Format(time.RFC3339), id.Reset.UTC().Format(time.RFC3339))
}

// Same reports whether id and o are the same life of the same server.
func (id ServerIdentity) Same(o ServerIdentity) bool {
	return id.Address == o.Address && id.Timeline == o.Timeline && id.Started.Equal(o.Started) && id.Reset.Equal(o.Reset)
}

// SameLife reports whether id and o are the same life of a server, at
// whatever address a session reached it: a pooler may reach one server at
// two (its IPv4 and IPv6 addresses), and only another life can have lost a
// commit. (Two servers whose postmasters started in the same microsecond on
// the same timeline with the same statistics' start are taken for one.)
func (id ServerIdentity) SameLife(o ServerIdentity) bool {
	return id.Timeline == o.Timeline && id.Started.Equal(o.Started) && id.Reset.Equal(o.Reset)
}

// scanServerIdentity reads sqlServerIdentity's row.
func scanServerIdentity(row pgx.Row) (ServerIdentity, error) {
	var addr, walFile *string
	var port *int32
	var reset *time.Time
	var id ServerIdentity
	if err := row.Scan(&addr, &port, &id.Started, &walFile, &reset); err != nil {
		return ServerIdentity{}, err
	}
	if addr != nil && port != nil {
		id.Address = *addr + ":" + strconv.Itoa(int(*port))
	}
	if walFile != nil && len(*walFile) >= 8 {
		if tl, err := strconv.ParseUint((*walFile)[:8], 16, 32); err == nil {
			id.Timeline = uint32(tl)
		}
	}
	if reset != nil {
		id.Reset = *reset
	}
	return id, nil
}

// Server reads the identity of the server a session of the Store's pool
// reaches now.
func (s *Store) Server(ctx context.Context) (ServerIdentity, error) {
	id, err := scanServerIdentity(s.pool.QueryRow(ctx, sqlServerIdentity))
	if err != nil {
		return ServerIdentity{}, fmt.Errorf("reading which server the ledger's database is: %w", err)
	}
	return id, nil
}

// ServerChange is what the sessions of a pool saw of its servers: Changes
// counts the new connections that reached another server (or life of it)
// than the connection before them, From and To the last such change.
type ServerChange struct {
	Changes  int
	From, To ServerIdentity
}

// serverWatch reads the identity of the server each new session of a pool
// reaches (its AfterConnect): a failover the pool reconnected through must
// not pass unnoticed.
type serverWatch struct {
	mu     sync.Mutex
	known  bool
	last   ServerIdentity
	change ServerChange
}

// afterConnect records conn's server. An identity it cannot read (a
// pooler or server that refuses the functions) is no reason to refuse the
// connection: the shard's proof does not depend on it.
func (w *serverWatch) afterConnect(ctx context.Context, conn *pgx.Conn) error {
	id, err := scanServerIdentity(conn.QueryRow(ctx, sqlServerIdentity))
	if err != nil {
		return nil //nolint:nilerr // see above
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.known && !w.last.Same(id) {
		w.change = ServerChange{Changes: w.change.Changes + 1, From: w.last, To: id}
	}
	w.known, w.last = true, id
	return nil
}

// serverWatches holds each pool's watch, as poolerProbes its probe.
var serverWatches sync.Map // weak.Pointer[pgxpool.Pool] -> *serverWatch

// ServerChanges is what the sessions of pool saw of its servers so far (a
// zero ServerChange for a pool Open did not make).
func ServerChanges(pool *pgxpool.Pool) ServerChange {
	w, ok := serverWatches.Load(weak.Make(pool))
	if !ok {
		return ServerChange{}
	}
	watch := w.(*serverWatch)
	watch.mu.Lock()
	defer watch.mu.Unlock()
	return watch.change
}

// ServerChanges is ServerChanges of the Store's pool.
func (s *Store) ServerChanges() ServerChange { return ServerChanges(s.pool) }
