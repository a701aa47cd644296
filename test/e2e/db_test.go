//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// sql runs one statement on a fresh connection (so that a restarted
// PostgreSQL is no problem) and returns the first column of its first row as
// an int64, 0 when it returns no row or no number.
func (e *env) sql(ctx context.Context, dsn, query string, args ...any) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if len(args) == 0 {
		// The simple protocol: several statements at once (a schema).
		args = []any{pgx.QueryExecModeSimpleProtocol}
	}
	rows, err := conn.Query(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var n int64
	if rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return 0, err
		}
		if len(vals) > 0 {
			switch v := vals[0].(type) {
			case int64:
				n = v
			case int32:
				n = int64(v)
			}
		}
	}
	rows.Close()
	return n, rows.Err()
}

// createDatabase creates a database of the test's own (the role may
// CREATEDB) and returns its DSN.
func (e *env) createDatabase(t *testing.T, name string) string {
	t.Helper()
	_, err := e.sql(context.Background(), e.adminDSN, fmt.Sprintf("CREATE DATABASE %s", pgx.Identifier{name}.Sanitize()))
	require.NoError(t, err, "create database %s", name)
	dsn, err := withDatabase(e.adminDSN, name)
	require.NoError(t, err)
	return dsn
}

func (e *env) dropDatabase(name string) error {
	_, err := e.sql(context.Background(), e.adminDSN, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize()))
	return err
}

// sinkSchema is the user's side of the effect: the effect inserts the newly
// claimed items into sink, in the ledger's transaction; a statement trigger
// sleeps per chunk so that a run spends its time inside transactions (where
// a killed pod, a leader change or a database restart hurts most).
const sinkSchema = `
CREATE TABLE sink (entity text NOT NULL, occurrence text NOT NULL);
GRANT INSERT ON sink TO runledger_effect;
CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(%g); RETURN NULL; END $$;
CREATE TRIGGER slow AFTER INSERT ON sink FOR EACH STATEMENT EXECUTE FUNCTION slow();`

// sinkEffect is spec.effect.sql of the tests' runs.
const sinkEffect = `INSERT INTO sink SELECT entity, occurrence FROM claimed`

// int runs a query on the test's database, retrying while the database is
// unreachable (for up to two minutes: PostgreSQL may be restarting).
func (f *fixture) int(query string, args ...any) int64 {
	f.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		n, err := f.sql(context.Background(), f.dsn, query, args...)
		if err == nil {
			return n
		}
		if time.Now().After(deadline) || !connectionError(err) {
			require.NoError(f.t, err, "query %q", query)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// rows runs a query on the test's database and calls scan for each row,
// retrying the whole query while the database is unreachable (for up to two
// minutes: PostgreSQL may be restarting); scan must start over when called
// again from the first row (reset is called before each try).
func (f *fixture) rows(reset func(), scan func(pgx.Rows) error, query string, args ...any) {
	f.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		reset()
		err := f.tryRows(scan, query, args...)
		if err == nil {
			return
		}
		if time.Now().After(deadline) || !connectionError(err) {
			require.NoError(f.t, err, "query %q", query)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (f *fixture) tryRows(scan func(pgx.Rows) error, query string, args ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	rows, err := conn.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

func connectionError(err error) bool {
	s := err.Error()
	for _, m := range []string{"connect", "connection", "shutting down", "57P01", "57P03", "EOF", "broken pipe", "reset by peer"} {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// committedRows is the number of committed ledger rows of a run (by UID).
func (f *fixture) committedRows(uid string) int64 {
	return f.int(`SELECT count(*) FROM runledger.ledger WHERE state = 'committed' AND run_uid = $1`, uid)
}

// ledgerExists reports whether the test's database is migrated (by the
// fixture, for the effect's sandbox, or by a worker).
func (f *fixture) ledgerExists() bool {
	return f.int(`SELECT count(*) FROM pg_tables WHERE schemaname = 'runledger' AND tablename = 'ledger'`) == 1
}

// requireExactlyOnce checks the guarantee over the whole test database: no
// business key with two committed rows, every ledger row committed (the
// tests never supersede), and the effect ran exactly once per committed row
// (one sink row each, none twice).
func (f *fixture) requireExactlyOnce(wantKeys int64) {
	f.t.Helper()
	require.Zero(f.t, f.int(`SELECT count(*) FROM (SELECT 1 FROM runledger.ledger WHERE state = 'committed' GROUP BY entity, occurrence HAVING count(*) > 1) d`),
		"no business key has two committed ledger rows")
	require.Equal(f.t, wantKeys, f.int(`SELECT count(*) FROM runledger.ledger`), "ledger rows (any state)")
	require.Equal(f.t, wantKeys, f.int(`SELECT count(*) FROM runledger.ledger WHERE state = 'committed'`), "committed ledger rows == distinct keys")
	require.Equal(f.t, wantKeys, f.int(`SELECT count(*) FROM sink`), "the effect ran once per committed row")
	require.Zero(f.t, f.int(`SELECT count(*) FROM (SELECT 1 FROM sink GROUP BY entity, occurrence HAVING count(*) > 1) d`),
		"the effect never ran twice for a key")
}

// effectRole is the role the cluster's PostgreSQL gives SQL effects
// (hack/cluster/lib/postgres.sh), as `runledger migrate --effect-role` does.
const effectRole = "runledger_effect"

// sandboxEffects migrates the database at dsn as its owner and gives its
// effect sandbox to effectRole: a worker refuses to run an effect without it.
func sandboxEffects(t *testing.T, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	_, err = ledger.Migrate(ctx, pool)
	require.NoError(t, err, "migrating %s", dsn)
	require.NoError(t, ledger.SetEffectRole(ctx, pool, effectRole))
}
