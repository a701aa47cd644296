package ledger

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"unicode/utf8"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// poolerProbe finds out, once per pool, whether its connections reach
// PostgreSQL itself or a pooler (PgBouncer, RDS Proxy, Supavisor, pgcat),
// and makes them use, behind a pooler, only statements it can route in
// transaction mode: no named prepared statement, which lives on one server
// connection while the next transaction may run on another.
type poolerProbe struct {
	mu     sync.Mutex
	known  bool
	pooled bool
	// pinned: the pool's sessions start with pinnedSearchPath (Open),
	// straight to PostgreSQL; dsnPath is the connection string's own
	// search_path, if it has one.
	pinned  bool
	dsnPath *string
	// userPath is the search_path a session of the pool would have without
	// the pin (its reset value, as the probe reads it): the one the user's
	// SQL runs under.
	userPath string
}

// beforeConnect is the pool's BeforeConnect: the first connection is
// preceded by a probe connection (closed at once) that compares the process
// ID the connection was given with the backend's own (sqlBackendPID); they
// differ behind a pooler, which hands out IDs of its own. A probe that fails
// is tried again by the next connection.
func (p *poolerProbe) beforeConnect(ctx context.Context, cc *pgx.ConnConfig) error {
	pooled, err := p.detect(ctx, cc)
	if err != nil {
		return err
	}
	if pooled {
		for _, name := range serverKeepalives {
			delete(cc.RuntimeParams, name)
		}
		p.withoutPin(cc.RuntimeParams) // a pooler refuses it
		// One round trip per statement, by the unnamed statement, its
		// description cached on the client: what a transaction pooler
		// routes (a mode the connection string chose is kept).
		if cc.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
			cc.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		}
		cc.StatementCacheCapacity = 0
	}
	return nil
}

func (p *poolerProbe) detect(ctx context.Context, cc *pgx.ConnConfig) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.known {
		return p.pooled, nil
	}
	probe := cc.Config.Copy()
	for _, name := range serverKeepalives { // a pooler refuses them
		delete(probe.RuntimeParams, name)
	}
	p.withoutPin(probe.RuntimeParams) // the path the user's SQL gets
	conn, err := pgconn.ConnectConfig(ctx, probe)
	if err != nil {
		return false, err
	}
	defer closeAwaitingExit(ctx, conn)
	res, err := conn.Exec(ctx, sqlBackendPID).ReadAll()
	if err != nil {
		return false, fmt.Errorf("asking the server for its backend's process ID: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 2 {
		return false, fmt.Errorf("asking the server for its backend's process ID: unexpected answer")
	}
	p.known, p.pooled = true, string(res[0].Rows[0][0]) != fmt.Sprint(conn.PID())
	p.userPath = string(res[0].Rows[0][1])
	return p.pooled, nil
}

// withoutPin puts back in params the search_path the connection string
// gave (or none), in place of the pin.
func (p *poolerProbe) withoutPin(params map[string]string) {
	if !p.pinned {
		return
	}
	if p.dsnPath != nil {
		params[searchPathParam] = *p.dsnPath
		return
	}
	delete(params, searchPathParam)
}

// userSearchPath is the search_path the user's SQL runs under on pool's
// sessions (poolerProbe.userPath): "" for a pool Open did not make, or
// before its first connection.
func userSearchPath(pool *pgxpool.Pool) string {
	p, ok := poolerProbes.Load(weak.Make(pool))
	if !ok {
		return ""
	}
	probe := p.(*poolerProbe)
	probe.mu.Lock()
	defer probe.mu.Unlock()
	return probe.userPath
}

// poolerProbes remembers each pool's probe, for BehindPooler. A pool is
// held weakly and its entry goes with it: a process that opens pools one
// after another (the tests, a long-lived caller) does not keep them all.
var poolerProbes sync.Map // weak.Pointer[pgxpool.Pool] -> *poolerProbe

// remember files v in m as pool's, until pool is garbage.
func remember[T any](m *sync.Map, pool *pgxpool.Pool, v *T) {
	key := weak.Make(pool)
	m.Store(key, v)
	runtime.AddCleanup(pool, func(k weak.Pointer[pgxpool.Pool]) { m.Delete(k) }, key)
}

// BehindPooler reports whether pool's connections reach PostgreSQL through
// a pooler, as its first connection found (false before any connection, or
// for a pool Open did not make).
func BehindPooler(pool *pgxpool.Pool) bool {
	p, ok := poolerProbes.Load(weak.Make(pool))
	if !ok {
		return false
	}
	probe := p.(*poolerProbe)
	probe.mu.Lock()
	defer probe.mu.Unlock()
	return probe.pooled
}

// MaxApplicationName is PostgreSQL's limit on application_name, in bytes
// (NAMEDATALEN - 1); a longer name is cut by the server.
const MaxApplicationName = 63

// ApplicationName names every connection of the pool name in
// pg_stat_activity (application_name, a startup parameter that PgBouncer
// accepts and passes on), cut to MaxApplicationName bytes at a UTF-8
// boundary. It replaces the connection string's application_name: a DBA
// finds runledger's sessions by theirs.
func ApplicationName(name string) Option {
	return func(cfg *pgxpool.Config) {
		if name != "" {
			cfg.ConnConfig.RuntimeParams["application_name"] = CutApplicationName(name)
		}
	}
}

// CutApplicationName cuts name to MaxApplicationName bytes, never inside a
// UTF-8 sequence.
func CutApplicationName(name string) string {
	if len(name) <= MaxApplicationName {
		return name
	}
	n := MaxApplicationName
	for n > 0 && !utf8.RuneStart(name[n]) {
		n--
	}
	return name[:n]
}

// WorkerApplicationName is the application_name of a worker pod's
// connections: runledger/<namespace>/<run>/shard-<shard>.
func WorkerApplicationName(namespace, run string, shard int) string {
	return fmt.Sprintf("runledger/%s/%s/shard-%d", namespace, run, shard)
}
