package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/internal/pgtest"
)

// TestOpenMasksTheDSNItCannotParse: pgx echoes a DSN it cannot parse; the
// error shows it with its secrets masked, whatever their quoting, and what
// pgx found wrong.
func TestOpenMasksTheDSNItCannotParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		dsn, want string
		never     []string
	}{
		{
			dsn:   `host=db port=notaport user=app password='open\' sesame' dbname=ledger`,
			want:  "parsing database URL: cannot parse `host=db port=notaport user=app password=xxxxx dbname=ledger`: invalid port",
			never: []string{"sesame", "open"},
		},
		{
			dsn:   `host=db password='never closed dbname=ledger`,
			want:  "parsing database URL: cannot parse `host=db password=xxxxx`: failed to parse as keyword/value (unterminated quoted string in connection info string)",
			never: []string{"never", "closed"},
		},
		{
			dsn:   "postgres://runledger:runledger@db:notaport/runledger?sslpassword=runledger",
			want:  "parsing database URL: cannot parse `postgres://runledger:xxxxx@db:notaport/runledger?sslpassword=xxxxx`: invalid port",
			never: []string{":runledger@", "=runledger"},
		},
		{
			dsn:   "postgres://app:p@ss:w@db/ledger",
			want:  "parsing database URL: cannot parse `postgres://app:xxxxx@db/ledger`: invalid port",
			never: []string{"ss:", ":w"},
		},
	}
	for _, tt := range tests {
		_, err := ledger.Open(context.Background(), tt.dsn, 1)
		require.Error(t, err, tt.dsn)
		require.Equal(t, tt.want, err.Error())
		for _, n := range tt.never {
			require.NotContains(t, err.Error(), n)
		}
	}
}

// TestWrongPasswordErrorHoldsNoPassword: what the server's refusal of a
// password looks like through pgx: the user and database, never the
// password, so that nothing needs masking there.
func TestWrongPasswordErrorHoldsNoPassword(t *testing.T) {
	t.Parallel()
	const wrong = "Wr0ng-pw-never-printed"
	dsn := pgtest.PasswordDSN(t, pgtest.NewEmptyDatabase(t), wrong)
	pool, err := ledger.Open(context.Background(), dsn, 1)
	require.NoError(t, err, "the pool connects lazily")
	defer pool.Close()
	err = pool.Ping(context.Background())
	require.Error(t, err)
	reason, rejected := ledger.ConnectionRejected(err)
	require.True(t, rejected, "%s: %v", reason, err)
	require.Contains(t, err.Error(), "password authentication failed for user \""+pgtest.PasswordUser+"\"")
	require.Contains(t, err.Error(), "user="+pgtest.PasswordUser+" database=")
	require.NotContains(t, err.Error(), wrong)
}

// TestPasswordFromPassfile: a DSN without a password takes it from a
// .pgpass file (here passfile=; ~/.pgpass and $PGPASSFILE work the same), as
// the README recommends over a password on the command line.
func TestPasswordFromPassfile(t *testing.T) {
	t.Parallel()
	withPassword := pgtest.PasswordDSN(t, pgtest.NewEmptyDatabase(t), "x")
	noPassword := strings.TrimSuffix(withPassword, " password=x")
	require.NotEqual(t, withPassword, noPassword)
	for _, tt := range []struct {
		password string
		ok       bool
	}{{pgtest.PasswordUserPassword, true}, {"wrong", false}} {
		passfile := filepath.Join(t.TempDir(), "pgpass")
		require.NoError(t, os.WriteFile(passfile, []byte("*:*:*:"+pgtest.PasswordUser+":"+tt.password+"\n"), 0o600))
		pool, err := ledger.Open(context.Background(), noPassword+" passfile="+passfile, 1)
		require.NoError(t, err)
		err = pool.Ping(context.Background())
		pool.Close()
		if tt.ok {
			require.NoError(t, err, "the password comes from the passfile")
			continue
		}
		_, rejected := ledger.ConnectionRejected(err)
		require.True(t, rejected, "the passfile's password is the one sent: %v", err)
	}
}

// TestOpenHoldsNoMoreThanItsPool: the connection Open's first connection
// opens to learn whether a pooler answers is gone from the server before
// the pool's own connections open, so a run holds at most its pool's
// connections on the server (the README's connection budget), never one
// more for a moment. A role with CONNECTION LIMIT 2 opens a pool of two and
// takes both at once, many times: the server refuses a third backend
// (53300), which the probe's used to be while it was still exiting.
func TestOpenHoldsNoMoreThanItsPool(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, "the limit is the server's, on its own backends")
	ctx := context.Background()
	owner := pgtest.Pool(t, pgtest.NewDatabase(t))
	cfg := owner.Config().ConnConfig
	role := "budget_" + cfg.Database
	mustExec(t, owner, `CREATE ROLE `+role+` LOGIN CONNECTION LIMIT 2`)
	t.Cleanup(func() { _, _ = owner.Exec(context.Background(), `DROP ROLE `+role) })
	dsn := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", cfg.Host, cfg.Port, role, cfg.Database)
	backends := func() (n int) {
		require.NoError(t, owner.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, role).Scan(&n))
		return n
	}
	for i := range 60 {
		pool, err := ledger.Open(ctx, dsn, 2)
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		conns := make([]*pgxpool.Conn, 2)
		for j := range 2 {
			wg.Go(func() { conns[j], errs[j] = pool.Acquire(ctx) })
		}
		wg.Wait()
		for j := range 2 {
			if conns[j] != nil {
				conns[j].Release()
			}
		}
		pool.Close()
		require.NoError(t, errors.Join(errs...), "pool %d: its two connections, with the role's limit of 2", i)
		// The pool's own connections are gone before the next pool opens.
		require.Eventually(t, func() bool { return backends() == 0 }, 10*time.Second, time.Millisecond)
	}
}
