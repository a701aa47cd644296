// Package ledgertest steps a test's ledger database through the embedded
// migrations, as the releases that ended at each of them left it: one copy
// of what tests of upgrades need, instead of SQL that undoes migrations by
// hand and drifts from them.
package ledgertest

import (
	"context"
	"io/fs"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/runledger/runledger/internal/ledger"
	"github.com/runledger/runledger/migrations"
)

// Provider is goose's provider of the embedded migrations on pool's
// database, with the version table ledger.Migrate keeps; it is closed with
// the test.
func Provider(t testing.TB, pool *pgxpool.Pool) *goose.Provider {
	t.Helper()
	db := stdlib.OpenDBFromPool(pool) // closing it leaves the pool open
	t.Cleanup(func() { _ = db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithTableName(ledger.Schema+".goose_db_version"), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatalf("loading the migrations: %v", err)
	}
	return p
}

// DownTo migrates pool's database to the latest migrations, then takes it
// back to version by the Down sections of the later ones, newest first: the
// schema of the release whose last migration was version.
func DownTo(t testing.TB, pool *pgxpool.Pool, version int64) *goose.Provider {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := ledger.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrating before going down to %d: %v", version, err)
	}
	p := Provider(t, pool)
	if _, err := p.DownTo(ctx, version); err != nil {
		t.Fatalf("migrating down to %d: %v", version, err)
	}
	return p
}

// MigrationsAfter is the number of embedded migrations whose version is
// above v: what a migrator applies to a ledger DownTo(v) left.
func MigrationsAfter(t testing.TB, v int64) int {
	t.Helper()
	files, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		version, err := strconv.ParseInt(f[:5], 10, 64)
		if err != nil {
			t.Fatalf("migration %s: %v", f, err)
		}
		if version > v {
			n++
		}
	}
	return n
}
