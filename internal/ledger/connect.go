package ledger

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/runledger/runledger/internal/redact"
)

// Open parses dsn and opens a pool on it (maxConns 0 keeps pgx's default),
// tuned by opts. Its first connection finds out whether it reaches
// PostgreSQL through a pooler (poolerProbe). Errors never contain the DSN's
// secrets.
func Open(ctx context.Context, dsn string, maxConns int32, opts ...Option) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing database URL: %w", parseError(err, dsn))
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	probe := &poolerProbe{}
	if v, ok := cfg.ConnConfig.RuntimeParams[searchPathParam]; ok {
		probe.dsnPath = &v
	}
	cfg.ConnConfig.RuntimeParams[searchPathParam] = pinnedSearchPath
	for _, o := range opts {
		o(cfg)
	}
	probe.pinned = cfg.ConnConfig.RuntimeParams[searchPathParam] == pinnedSearchPath
	if !probe.pinned && probe.dsnPath != nil { // KeepSearchPath
		cfg.ConnConfig.RuntimeParams[searchPathParam] = *probe.dsnPath
	}
	// A session that may not write does not go back to the pool: the next
	// try opens another, which can reach the new primary. It goes when
	// released, not at the error: an effect's own 25006 (user code may raise
	// any SQLSTATE) fails its items on that session, which the chunk's
	// rollback to its savepoint still needs.
	onPgError := cfg.ConnConfig.OnPgError
	cfg.ConnConfig.OnPgError = func(c *pgconn.PgConn, pgErr *pgconn.PgError) bool {
		if isReadOnlySession(pgErr) {
			c.CustomData()[readOnlySeen] = true
		}
		return onPgError == nil || onPgError(c, pgErr)
	}
	afterRelease := cfg.AfterRelease
	cfg.AfterRelease = func(c *pgx.Conn) bool {
		return c.PgConn().CustomData()[readOnlySeen] != true && (afterRelease == nil || afterRelease(c))
	}
	next := cfg.BeforeConnect
	cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		if next != nil {
			if err := next(ctx, cc); err != nil {
				return err
			}
		}
		return probe.beforeConnect(ctx, cc)
	}
	watch := &serverWatch{}
	after := cfg.AfterConnect
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if after != nil {
			if err := after(ctx, conn); err != nil {
				return err
			}
		}
		return watch.afterConnect(ctx, conn)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening database pool: %w", redact.New(dsn).Error(err))
	}
	remember(&poolerProbes, pool, probe)
	remember(&serverWatches, pool, watch)
	return pool, nil
}

// The search_path every session of a pool Open makes starts with, as its
// startup parameter: the session's reset value, so RESET ALL (after the
// user's SQL: sqlResetSession) keeps it. Every statement of the ledger is
// then parsed, prepared and planned naming only the catalog's functions,
// operators and types (pg_temp, listed last, is searched after pg_catalog
// for relations and types, never for functions and operators), whatever
// the login's default says: a user's public.cardinality(bigint[]) or
// public.pg_try_advisory_lock(double precision), a better match than the
// catalog's polymorphic or bigint one, never answers for it. The user's SQL
// runs under the path the session would have had (poolerProbe.userPath,
// sqlUserPath). Behind a pooler, which refuses the parameter, each of the
// ledger's transactions pins it first (sqlPinnedSearchPath), and its
// statements are parsed in that transaction, in order (no named statement).
// readOnlySeen marks a session that answered a statement with
// isReadOnlySession: the pool drops it when it is released.
const readOnlySeen = "runledger.readOnlySeen"

const (
	searchPathParam  = "search_path"
	pinnedSearchPath = "pg_catalog, pg_temp"
)

// KeepSearchPath leaves the sessions' search_path as the server and the
// connection string give it, for a pool that also runs SQL of the caller's
// own that names its tables unqualified (the tests'): the ledger's
// statements still pin theirs in each transaction, but a pipeline's are
// prepared before its first statement runs. runledger never passes it.
func KeepSearchPath() Option {
	return func(cfg *pgxpool.Config) { delete(cfg.ConnConfig.RuntimeParams, searchPathParam) }
}

// parseError returns pgx's error for a DSN it cannot parse with the DSN
// masked by redact.DSN instead of pgx's own best-effort mask, which shows the
// rest of a quoted password after an escaped quote (password='a\' b'). The
// result no longer wraps err: its chain prints pgx's form.
func parseError(err error, dsn string) error {
	r := redact.New(dsn)
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return r.Error(err)
	}
	// pgx's text is "cannot parse `DSN`: what (cause)"; its what and cause
	// never hold the DSN.
	msg := pe.Error()
	cause := errors.Unwrap(pe)
	if cause != nil {
		msg = strings.TrimSuffix(msg, " ("+cause.Error()+")")
	}
	what := "invalid connection string"
	if i := strings.LastIndex(msg, "`: "); i >= 0 {
		what = msg[i+len("`: "):]
	}
	out := fmt.Sprintf("cannot parse `%s`: %s", redact.DSN(pe.ConnString), what)
	if cause != nil {
		out += " (" + cause.Error() + ")"
	}
	return errors.New(r.String(out))
}

// backendExitWait bounds how long closeAwaitingExit waits for the server.
const backendExitWait = 2 * time.Second

// closeAwaitingExit ends conn's session and waits, at most backendExitWait
// (or ctx's deadline), for the server to close the connection. A backend
// closes its socket as the last step of its exit, after it left
// pg_stat_activity and freed its slot of max_connections and of its role's
// CONNECTION LIMIT: a connection opened next is then never one too many on
// the server, as the probe's still exiting was for a pool that opened its
// connections at once (TestOpenHoldsNoMoreThanItsPool). A server that does
// not answer is not waited for longer: the connection is closed all the
// same.
func closeAwaitingExit(ctx context.Context, conn *pgconn.PgConn) {
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if conn.SyncConn(ctx) != nil {
		return
	}
	conn.Frontend().Send(&pgproto3.Terminate{})
	if conn.Frontend().Flush() != nil {
		return
	}
	deadline := time.Now().Add(backendExitWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if conn.Conn().SetReadDeadline(deadline) != nil {
		return
	}
	_, _ = io.Copy(io.Discard, conn.Conn()) // until the server's EOF
}
