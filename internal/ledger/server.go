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
// timeline (and usually the address). Either may have lost commits the old
// one acknowledged (an asynchronous standby's missing tail; a crash with
// synchronous_commit off).
type ServerIdentity struct {
	Address  string    // inet_server_addr and port; "" over a Unix socket
	Started  time.Time // pg_postmaster_start_time()
	Timeline uint32    // the WAL's timeline; 0 on a standby (in recovery)
}

func (id ServerIdentity) String() string {
	where := id.Address
	if where == "" {
		where = "local socket"
	}
	tl := "in recovery"
	if id.Timeline != 0 {
		tl = fmt.Sprintf("timeline %d", id.Timeline)
	}
	return fmt.Sprintf("%s, %s, started %s", where, tl, id.Started.UTC().Format(time.RFC3339))
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
	var addr *string
	var port *int32
	var walFile *string
	var id ServerIdentity
	if err := conn.QueryRow(ctx, sqlServerIdentity).Scan(&addr, &port, &id.Started, &walFile); err != nil {
		return nil //nolint:nilerr // see above
	}
	if addr != nil && port != nil {
		id.Address = *addr + ":" + strconv.Itoa(int(*port))
	}
	if walFile != nil && len(*walFile) >= 8 {
		if tl, err := strconv.ParseUint((*walFile)[:8], 16, 32); err == nil {
			id.Timeline = uint32(tl)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.known && w.last != id {
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
